package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corralrun/corral/internal/errdefs"
)

// writeLayout writes img as the only image of a new OCI layout.
func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatalf("writing layout: %v", err)
	}
	return dir
}

// tarDir archives the files of dir (a layout) into a tar file.
func tarDir(t *testing.T, dir string, compress bool) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "archive.tar")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var w io.Writer = f
	var zw *gzip.Writer
	if compress {
		zw = gzip.NewWriter(f)
		w = zw
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// dockerSave writes a classic `docker save` archive by hand: uncompressed
// layer tarballs in <n>/layer.tar, the config as <hex>.json, and
// manifest.json last, as Docker before version 25 did. tamper, if set,
// changes the bytes of the second layer after the config recorded its
// diff ID.
func dockerSave(t *testing.T, tag string, cfg v1.Config, tamper bool, layers ...[]byte) string {
	t.Helper()
	cf := v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: cfg, RootFS: v1.RootFS{Type: "layers"}}
	for _, l := range layers {
		sum := sha256.Sum256(l)
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])})
	}
	rawCfg, err := json.Marshal(cf)
	if err != nil {
		t.Fatal(err)
	}
	cfgSum := sha256.Sum256(rawCfg)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	type entry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	m := []entry{{Config: cfgName, RepoTags: []string{tag}}}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for i, l := range layers {
		if tamper && i == 1 {
			l = bytes.Replace(l, []byte("new"), []byte("NEW"), 1)
		}
		n := string(rune('a'+i)) + "/layer.tar"
		m[0].Layers = append(m[0].Layers, n)
		add(n, l)
	}
	add(cfgName, rawCfg)
	rawManifest, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	add("manifest.json", rawManifest)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "saved.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// gzipFile compresses the file at p into a new file.
func gzipFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	out := p + ".gz"
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

var whiteoutLayers = [][]member{
	{dir("etc"), file("etc/keep", "k"), file("etc/secret", "s"),
		dir("srv/app"), file("srv/app/old.py", "old"), dir("srv/app/cache"), file("srv/app/cache/x", "x")},
	{file("etc/.wh.secret", ""), dir("srv/app"), file("srv/app/.wh..wh..opq", ""), file("srv/app/main.py", "new")},
}

func TestLoad(t *testing.T) {
	cfg := v1.Config{Env: []string{"A=1"}, WorkingDir: "/srv/app", User: "app"}
	img := whiteoutImage(t)
	var raw [][]byte
	for _, l := range whiteoutLayers {
		raw = append(raw, tarBytes(t, l...))
	}
	ggcrSave := filepath.Join(t.TempDir(), "ggcr.tar")
	tag, err := name.NewTag("corral/test:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(ggcrSave, tag, img); err != nil {
		t.Fatal(err)
	}
	layoutDir := writeLayout(t, img)

	tests := []struct {
		name string
		path string
		opts LoadOptions
		want Defaults
	}{
		{"OCI layout directory", layoutDir, LoadOptions{}, img2defaults(t, img)},
		{"OCI layout archive", tarDir(t, layoutDir, false), LoadOptions{}, img2defaults(t, img)},
		{"gzip-compressed OCI layout archive", tarDir(t, layoutDir, true), LoadOptions{}, img2defaults(t, img)},
		{"docker save archive with compressed layers", ggcrSave, LoadOptions{}, img2defaults(t, img)},
		{"classic docker save archive", dockerSave(t, "corral/test:1", cfg, false, raw...), LoadOptions{Ref: "corral/test:1"}, Defaults{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User}},
		{"gzip-compressed classic docker save archive", gzipFile(t, dockerSave(t, "corral/test:1", cfg, false, raw...)), LoadOptions{}, Defaults{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := openCache(t)
			got, err := c.Load(t.Context(), tc.path, tc.opts)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			parent, root := sandboxDirs(t)
			if err := got.Unpack(t.Context(), root); err != nil {
				t.Fatalf("Unpack: %v", err)
			}
			if diff := cmp.Diff(whiteoutTree, tree(t, root)); diff != "" {
				t.Errorf("tree (-want +got):\n%s", diff)
			}
			checkOutside(t, parent)
			if diff := cmp.Diff(tc.want, got.Defaults()); diff != "" {
				t.Errorf("Defaults (-want +got):\n%s", diff)
			}
			if tmp, _ := os.ReadDir(c.tmpDir()); len(tmp) != 0 {
				t.Errorf("temporary files left: %v", tmp)
			}
			// A second load finds everything cached and gives the same image.
			again, err := c.Load(t.Context(), tc.path, tc.opts)
			if err != nil {
				t.Fatalf("second Load: %v", err)
			}
			if again.Digest != got.Digest {
				t.Errorf("second load digest %s, first %s", again.Digest, got.Digest)
			}
		})
	}
}

func img2defaults(t *testing.T, img v1.Image) Defaults {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return (&Image{Config: cf}).Defaults()
}

func TestLoadRefusesTamperedBlobs(t *testing.T) {
	img := whiteoutImage(t)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	// swap replaces the blob of digest d in a layout with other bytes.
	swap := func(t *testing.T, dir string, d v1.Hash, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", d.Hex), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	otherLayer, err := layer(t, file("etc/secret", "evil")).Compressed()
	if err != nil {
		t.Fatal(err)
	}
	evil, err := io.ReadAll(otherLayer)
	if err != nil {
		t.Fatal(err)
	}
	var raw [][]byte
	for _, l := range whiteoutLayers {
		raw = append(raw, tarBytes(t, l...))
	}

	tests := []struct {
		name    string
		path    func(t *testing.T) string
		wantMsg string
	}{
		{
			name: "layer replaced in a layout directory",
			path: func(t *testing.T) string {
				dir := writeLayout(t, img)
				swap(t, dir, m.Layers[1].Digest, evil)
				return dir
			},
			wantMsg: "layer 2/2 " + m.Layers[1].Digest.String(),
		},
		{
			name: "one byte of a layer flipped in a layout directory",
			path: func(t *testing.T) string {
				dir := writeLayout(t, img)
				p := filepath.Join(dir, "blobs", "sha256", m.Layers[0].Digest.Hex)
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 1
				swap(t, dir, m.Layers[0].Digest, b)
				return dir
			},
			wantMsg: "layer 1/2 " + m.Layers[0].Digest.String(),
		},
		{
			name: "config replaced in a layout directory",
			path: func(t *testing.T) string {
				dir := writeLayout(t, img)
				swap(t, dir, m.Config.Digest, []byte(`{"config":{"User":"root"}}`))
				return dir
			},
			wantMsg: "config " + m.Config.Digest.String(),
		},
		{
			name: "layer replaced in an OCI archive",
			path: func(t *testing.T) string {
				dir := writeLayout(t, img)
				swap(t, dir, m.Layers[0].Digest, evil)
				return tarDir(t, dir, false)
			},
			wantMsg: "blobs/sha256/" + m.Layers[0].Digest.Hex,
		},
		{
			name: "layer changed in a docker save archive",
			path: func(t *testing.T) string {
				return dockerSave(t, "x:1", v1.Config{}, true, raw...)
			},
			wantMsg: "layer 2/2 b/layer.tar",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := openCache(t)
			_, err := c.Load(t.Context(), tc.path(t), LoadOptions{})
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Load error = %v, want ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) || !strings.Contains(err.Error(), "does not match its") {
				t.Errorf("error %q does not say that %q does not match its descriptor", err, tc.wantMsg)
			}
			// Nothing unverified was kept, and nothing half-written.
			tmp, _ := os.ReadDir(c.tmpDir())
			if len(tmp) != 0 {
				t.Errorf("temporary files left: %v", tmp)
			}
			entries, _ := os.ReadDir(c.blobDir())
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(c.blobDir(), e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != e.Name() {
					t.Errorf("cached blob %s does not match its name", e.Name())
				}
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	c := openCache(t)
	notImage := filepath.Join(t.TempDir(), "x.tar")
	if err := os.WriteFile(notImage, tarBytes(t, file("hello", "world")), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		opts LoadOptions
		kind error
	}{
		{"missing path", filepath.Join(t.TempDir(), "nope"), LoadOptions{}, errdefs.ErrNotFound},
		{"tar that is not an image", notImage, LoadOptions{}, errdefs.ErrInvalidArgument},
		{"directory that is not a layout", t.TempDir(), LoadOptions{}, errdefs.ErrInvalidArgument},
		{"name not in the layout", writeLayout(t, whiteoutImage(t)), LoadOptions{Ref: "nothing-by-this-name"}, errdefs.ErrNotFound},
		{"tag not in the archive", dockerSave(t, "a:1", v1.Config{}, false, tarBytes(t, file("a", "a"))), LoadOptions{Ref: "b:2"}, errdefs.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Load(t.Context(), tc.path, tc.opts)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Load error = %v, want %v", err, tc.kind)
			}
		})
	}
}
