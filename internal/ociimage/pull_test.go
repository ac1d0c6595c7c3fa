package ociimage

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corralrun/corral/internal/errdefs"
)

// testRegistry is an in-process registry on loopback that counts blob
// requests and can demand basic auth.
type testRegistry struct {
	host      string
	blobGets  atomic.Int64
	transport *http.Transport
	// user and password, when set, are required on every request.
	user, password string
}

func startRegistry(t *testing.T, user, password string) *testRegistry {
	t.Helper()
	r := &testRegistry{transport: &http.Transport{}, user: user, password: password}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != r.user || p != r.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"credentials required"}]}`)
				return
			}
		}
		if strings.Contains(req.URL.Path, "/blobs/") && req.Method == http.MethodGet {
			r.blobGets.Add(1)
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(func() {
		srv.Close()
		r.transport.CloseIdleConnections()
	})
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.Authenticator(authn.Anonymous)
	if r.user != "" {
		auth = &authn.Basic{Username: r.user, Password: r.password}
	}
	if err := remote.Write(ref, img, remote.WithTransport(r.transport), remote.WithAuth(auth)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref.String()
}

func (r *testRegistry) pullOptions() PullOptions {
	return PullOptions{Transport: r.transport, Keychain: anonymous{}}
}

// anonymous is a keychain with no credentials, so tests never read the
// docker config of the machine they run on.
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

func openCache(t *testing.T) *Cache {
	t.Helper()
	c, err := OpenCache(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// whiteoutImage has a file deleted and a directory made opaque by its
// upper layer, and a run config.
func whiteoutImage(t *testing.T) v1.Image {
	return testImage(t,
		v1.Config{
			Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
			WorkingDir: "/srv/app",
			User:       "1000:1000",
			Entrypoint: []string{"/bin/sh"},
			Cmd:        []string{"-c", "echo hi"},
			Labels:     map[string]string{"org.example": "yes"},
		},
		layer(t, dir("etc"), file("etc/keep", "k"), file("etc/secret", "s"),
			dir("srv/app"), file("srv/app/old.py", "old"), dir("srv/app/cache"), file("srv/app/cache/x", "x")),
		layer(t, file("etc/.wh.secret", ""), dir("srv/app"), file("srv/app/.wh..wh..opq", ""), file("srv/app/main.py", "new")),
	)
}

var whiteoutTree = map[string]string{
	"etc": "dir", "etc/keep": "file:k",
	"srv": "dir", "srv/app": "dir", "srv/app/main.py": "file:new",
}

func TestPullUnpacksWithWhiteoutsAndDefaults(t *testing.T) {
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "corral/whiteout:1", whiteoutImage(t))
	c := openCache(t)

	img, err := c.Pull(t.Context(), ref, reg.pullOptions())
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	parent, root := sandboxDirs(t)
	if err := img.Unpack(t.Context(), root); err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	if diff := cmp.Diff(whiteoutTree, tree(t, root)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
	checkOutside(t, parent)

	want := Defaults{
		Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		WorkingDir: "/srv/app",
		User:       "1000:1000",
		Entrypoint: []string{"/bin/sh"},
		Cmd:        []string{"-c", "echo hi"},
		Labels:     map[string]string{"org.example": "yes"},
	}
	if diff := cmp.Diff(want, img.Defaults()); diff != "" {
		t.Errorf("Defaults (-want +got):\n%s", diff)
	}
	// Defaults survive a JSON round trip, as the lead stores them.
	b, err := json.Marshal(img.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	var back Defaults
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, back); diff != "" {
		t.Errorf("Defaults after JSON (-want +got):\n%s", diff)
	}
}

func TestSecondPullDownloadsNoBlobs(t *testing.T) {
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "corral/cached:1", whiteoutImage(t))
	c := openCache(t)
	var out bytes.Buffer
	opts := reg.pullOptions()
	opts.Progress = NewProgressPrinter(&out).Update

	before := reg.blobGets.Load()
	first, err := c.Pull(t.Context(), ref, opts)
	if err != nil {
		t.Fatalf("first Pull: %v", err)
	}
	if got := reg.blobGets.Load() - before; got != 3 {
		t.Errorf("first pull made %d blob requests, want 3 (config and two layers)", got)
	}
	if !strings.Contains(out.String(), "pulling layer "+shortID(first.Manifest.Layers[0].Digest.String())) {
		t.Errorf("progress output lacks a line for the first layer:\n%s", out.String())
	}

	out.Reset()
	before = reg.blobGets.Load()
	second, err := c.Pull(t.Context(), ref, opts)
	if err != nil {
		t.Fatalf("second Pull: %v", err)
	}
	if got := reg.blobGets.Load() - before; got != 0 {
		t.Errorf("second pull made %d blob requests, want 0", got)
	}
	if second.Digest != first.Digest {
		t.Errorf("second pull digest %s, first %s", second.Digest, first.Digest)
	}
	if !strings.Contains(out.String(), "already cached") {
		t.Errorf("progress output of the cached pull does not say so:\n%s", out.String())
	}
	_, root := sandboxDirs(t)
	if err := second.Unpack(t.Context(), root); err != nil {
		t.Fatalf("Unpack: %v", err)
	}
}

func TestPullRefusesMaliciousLayerAtUnpack(t *testing.T) {
	reg := startRegistry(t, "", "")
	evil := layer(t, symlink("etc", "/"), file("etc/tmp/pwned", "x"))
	ref := reg.push(t, "corral/evil:1", testImage(t, v1.Config{}, layer(t, file("ok", "ok")), evil))
	c := openCache(t)
	img, err := c.Pull(t.Context(), ref, reg.pullOptions())
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	parent, root := sandboxDirs(t)
	err = img.Unpack(t.Context(), root)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Unpack error = %v, want ErrInvalidArgument", err)
	}
	d, _ := evil.Digest()
	for _, want := range []string{"layer 2/2 " + d.String(), `entry "etc/tmp/pwned"`, `symlink "etc" -> "/"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	checkOutside(t, parent)
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Errorf("/tmp/pwned exists on the host")
	}
}

func TestPullPlatformFromIndex(t *testing.T) {
	reg := startRegistry(t, "", "")
	amd := testImage(t, v1.Config{Env: []string{"ARCH=amd64"}}, layer(t, file("arch", "amd64")))
	arm := testImage(t, v1.Config{Env: []string{"ARCH=arm64"}}, layer(t, file("arch", "arm64")))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	ref, err := name.ParseReference(reg.host + "/corral/multi:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithTransport(reg.transport)); err != nil {
		t.Fatalf("pushing index: %v", err)
	}
	c := openCache(t)
	for _, tc := range []struct{ platform, want string }{{"", "amd64"}, {"linux/arm64", "arm64"}} {
		opts := reg.pullOptions()
		opts.Platform = tc.platform
		img, err := c.Pull(t.Context(), ref.String(), opts)
		if err != nil {
			t.Fatalf("Pull for %q: %v", tc.platform, err)
		}
		if got := img.Defaults().Env; len(got) != 1 || got[0] != "ARCH="+tc.want {
			t.Errorf("platform %q: env %v, want ARCH=%s", tc.platform, got, tc.want)
		}
	}
	opts := reg.pullOptions()
	opts.Platform = "linux/s390x"
	_, err = c.Pull(t.Context(), ref.String(), opts)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "linux/arm64/v8") {
		t.Errorf("pull for a missing platform: %v, want ErrNotFound listing the platforms", err)
	}
}

func TestPullErrors(t *testing.T) {
	reg := startRegistry(t, "", "")
	c := openCache(t)
	tests := []struct {
		name string
		ref  string
		kind error
	}{
		{"malformed reference", "UPPER/Case::x", errdefs.ErrInvalidArgument},
		{"unknown repository", reg.host + "/nobody/here:1", errdefs.ErrNotFound},
		{"unreachable registry", "127.0.0.1:1/x/y:1", errdefs.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Pull(t.Context(), tc.ref, reg.pullOptions())
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Pull error = %v, want %v", err, tc.kind)
			}
		})
	}
}

func TestPullAuthFromDockerConfig(t *testing.T) {
	reg := startRegistry(t, "corral", "s3cret")
	ref := reg.push(t, "private/img:1", testImage(t, v1.Config{}, layer(t, file("a", "a"))))
	c := openCache(t)

	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	opts := PullOptions{Transport: reg.transport} // nil Keychain: the docker config
	_, err := c.Pull(t.Context(), ref, opts)
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("Pull without credentials: %v, want ErrUnauthenticated", err)
	}

	auth := base64.StdEncoding.EncodeToString([]byte("corral:s3cret"))
	cfg := `{"auths":{"` + reg.host + `":{"auth":"` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(t.Context(), ref, opts); err != nil {
		t.Fatalf("Pull with credentials in the docker config: %v", err)
	}
}

func TestGCRemovesUnreferencedBlobs(t *testing.T) {
	reg := startRegistry(t, "", "")
	keepRef := reg.push(t, "corral/keep:1", testImage(t, v1.Config{}, layer(t, file("keep", "1"))))
	dropRef := reg.push(t, "corral/drop:1", testImage(t, v1.Config{}, layer(t, file("drop", "2")), layer(t, file("drop2", "3"))))
	c := openCache(t)
	keepImg, err := c.Pull(t.Context(), keepRef, reg.pullOptions())
	if err != nil {
		t.Fatal(err)
	}
	dropImg, err := c.Pull(t.Context(), dropRef, reg.pullOptions())
	if err != nil {
		t.Fatal(err)
	}
	keep := map[v1.Hash]bool{}
	for _, d := range keepImg.Blobs() {
		keep[d] = true
	}
	st, err := c.GC(t.Context(), keep)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if st.Blobs != 4 {
		t.Errorf("GC removed %d blobs, want 4 (manifest, config, two layers)", st.Blobs)
	}
	for _, d := range dropImg.Blobs() {
		if c.Has(d) {
			t.Errorf("blob %s of the dropped image is still cached", d)
		}
	}
	again, err := c.Image(t.Context(), keepImg.Digest)
	if err != nil {
		t.Fatalf("reopening the kept image: %v", err)
	}
	_, root := sandboxDirs(t)
	if err := again.Unpack(t.Context(), root); err != nil {
		t.Fatalf("Unpack of the kept image: %v", err)
	}
	if _, err := c.Image(t.Context(), dropImg.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("reopening the dropped image: %v, want ErrNotFound", err)
	}
	// It pulls again, downloading what GC removed.
	before := reg.blobGets.Load()
	if _, err := c.Pull(t.Context(), dropRef, reg.pullOptions()); err != nil {
		t.Fatal(err)
	}
	if got := reg.blobGets.Load() - before; got != 3 {
		t.Errorf("pull after GC made %d blob requests, want 3", got)
	}
}

func TestCorruptCachedLayerIsRefusedAndRemoved(t *testing.T) {
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "corral/rot:1", whiteoutImage(t))
	c := openCache(t)
	img, err := c.Pull(t.Context(), ref, reg.pullOptions())
	if err != nil {
		t.Fatal(err)
	}
	l := img.Manifest.Layers[1]
	p := c.blobPath(l.Digest)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff // the gzip trailer: the tar content still reads
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, root := sandboxDirs(t)
	err = img.Unpack(t.Context(), root)
	if err == nil || !strings.Contains(err.Error(), l.Digest.String()) {
		t.Fatalf("Unpack of a corrupt blob: %v, want an error naming %s", err, l.Digest)
	}
	if c.Has(l.Digest) {
		t.Errorf("corrupt blob is still in the cache")
	}
	if _, err := c.Pull(t.Context(), ref, reg.pullOptions()); err != nil {
		t.Fatalf("pull after corruption: %v", err)
	}
	if !c.Has(l.Digest) {
		t.Errorf("pull did not fetch the removed blob again")
	}
}

func TestPullZstdLayer(t *testing.T) {
	reg := startRegistry(t, "", "")
	b := tarBytes(t, dir("z"), file("z/file", "zstd"))
	zl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := zl.MediaType(); mt != types.OCILayerZStd {
		t.Fatalf("layer media type %s, want zstd", mt)
	}
	ref := reg.push(t, "corral/zstd:1", testImage(t, v1.Config{}, layer(t, file("gz", "gzip")), zl))
	img, err := openCache(t).Pull(t.Context(), ref, reg.pullOptions())
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	_, root := sandboxDirs(t)
	if err := img.Unpack(t.Context(), root); err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	want := map[string]string{"gz": "file:gzip", "z": "dir", "z/file": "file:zstd"}
	if diff := cmp.Diff(want, tree(t, root)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
}
