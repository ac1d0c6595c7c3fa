package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// member is one tar entry of the layers these tests build.
type member struct {
	name, body, link string
	typ              byte
	mode             int64
}

func file(name, body string) member {
	return member{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string) member { return member{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// tarBytes builds an uncompressed tar of members.
func tarBytes(t testing.TB, members ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		hdr := &tar.Header{
			Name: m.name, Linkname: m.link, Typeflag: m.typ, Mode: m.mode,
			ModTime: testTime, Format: tar.FormatPAX,
		}
		if m.typ == tar.TypeReg {
			hdr.Size = int64(len(m.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("writing tar header %q: %v", m.name, err)
		}
		if _, err := io.WriteString(tw, m.body); err != nil {
			t.Fatalf("writing tar body %q: %v", m.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer is a gzip-compressed image layer of members.
func layer(t testing.TB, members ...member) v1.Layer {
	t.Helper()
	b := tarBytes(t, members...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatalf("making layer: %v", err)
	}
	return l
}

// testImage stacks layers on an empty image and sets its run config.
func testImage(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatalf("appending layers: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatalf("setting config: %v", err)
	}
	return img
}

// tree describes a directory as path -> "dir", "file:<body>" or
// "link:<target>", without the root itself.
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "link:" + target
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "file:" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

// sandboxDirs makes parent/outside/sentinel and parent/root and returns
// parent and root. checkOutside fails the test if anything in parent but
// root changed.
func sandboxDirs(t testing.TB) (parent, root string) {
	t.Helper()
	parent = t.TempDir()
	if err := os.MkdirAll(filepath.Join(parent, "outside"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "outside", "sentinel"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	root = filepath.Join(parent, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return parent, root
}

func checkOutside(t testing.TB, parent string) {
	t.Helper()
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if len(names) != 2 || names[0] != "outside" || names[1] != "root" {
		t.Errorf("entries next to the rootfs = %v, want [outside root]", names)
	}
	got := tree(t, filepath.Join(parent, "outside"))
	if len(got) != 1 || got["sentinel"] != "file:keep" {
		t.Errorf("outside directory changed: %v", got)
	}
}
