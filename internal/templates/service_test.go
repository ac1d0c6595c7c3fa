package templates

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
)

// env is a Service on a Manager with the fake driver and fake storage.
type env struct {
	svc     *Service
	m       *sandbox.Manager
	storage *storagefake.Backend
	build   string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	sock, err := os.MkdirTemp("", "img-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	drv, err := fake.New(fake.Config{Root: sock})
	if err != nil {
		t.Fatal(err)
	}
	st, err := records.Open(t.Context(), filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{storage: storagefake.New(t.TempDir()), build: t.TempDir()}
	e.m, err = sandbox.New(sandbox.Config{Store: st, Storage: e.storage, Drivers: []driver.Driver{drv}, ReapInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.m.Close() })
	e.svc, err = Open(Config{Manager: e.m, CacheDir: t.TempDir(), BuildDir: e.build})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.svc.Close() })
	return e
}

// member is one entry of a test layer: a file with a body, or a
// directory when body is "/".
type member struct{ name, body string }

func layer(t *testing.T, members ...member) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		hdr := &tar.Header{Name: m.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(m.body))}
		if m.body == "/" {
			hdr = &tar.Header{Name: m.name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			io.WriteString(tw, m.body)
		}
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// twoLayers is an image whose upper layer deletes a file of the lower
// one.
func twoLayers(t *testing.T) v1.Image {
	return testImage(t, v1.Config{Env: []string{"PATH=/bin", "GREETING=hi"}, WorkingDir: "/work", User: "1000", Cmd: []string{"sh"}},
		layer(t, member{"etc/", "/"}, member{"etc/hello", "hello"}, member{"etc/gone", "x"}),
		layer(t, member{"etc/.wh.gone", ""}, member{"app/", "/"}, member{"app/main", "main"}))
}

// startRegistry serves an in-process registry on loopback and returns its
// host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, host, repo string, img v1.Image) string {
	t.Helper()
	ref := host + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// files lists a template's tree as path -> body ("/" for directories).
func files(t *testing.T, e *env, tmpl string) map[string]string {
	t.Helper()
	root := e.storage.TemplatePath(tmpl)
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			out[rel] = "/"
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPull(t *testing.T) {
	e := newEnv(t)
	ref := push(t, startRegistry(t), "test/two:1", twoLayers(t))
	var mu sync.Mutex
	var progress []ociimage.Progress
	var log strings.Builder
	tmpl, err := e.svc.Pull(t.Context(), "two", PullOptions{Ref: ref, Log: &log, Progress: func(p ociimage.Progress) {
		mu.Lock()
		progress = append(progress, p)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"etc": "/", "etc/hello": "hello", "app": "/", "app/main": "main", "work": "/"}
	if diff := cmp.Diff(want, files(t, e, "two")); diff != "" {
		t.Errorf("template tree (-want +got):\n%s", diff)
	}
	wantDefaults := &sandbox.Defaults{Env: []string{"PATH=/bin", "GREETING=hi"}, WorkingDir: "/work", User: "1000", Cmd: []string{"sh"}}
	if diff := cmp.Diff(wantDefaults, tmpl.Defaults); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if tmpl.Source != "pull" || tmpl.Image != ref || !strings.HasPrefix(tmpl.Digest, "sha256:") {
		t.Errorf("template record %+v", tmpl)
	}
	if len(progress) == 0 || !strings.Contains(log.String(), "pulled "+ref) {
		t.Errorf("no progress (%d reports) or log %q", len(progress), log.String())
	}
	if _, err := e.svc.Pull(t.Context(), "two", PullOptions{Ref: ref}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("pull into an existing name: %v", err)
	}
	if _, err := e.svc.Pull(t.Context(), "missing", PullOptions{Ref: strings.Replace(ref, ":1", ":nope", 1)}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("pull of an unknown tag: %v", err)
	}
	if _, err := e.m.Template(t.Context(), "missing"); err == nil {
		t.Error("a failed pull left a template")
	}
}

// archive returns the image as a tar in one of the formats Import reads.
func archive(t *testing.T, img v1.Image, format string) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch format {
	case "docker":
		ref, _ := name.ParseReference("example.test/img:1")
		if err := tarball.Write(ref, img, &buf); err != nil {
			t.Fatal(err)
		}
	case "oci":
		dir := t.TempDir()
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(&buf)
		if err := tw.AddFS(os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		tw.Close()
	}
	return buf.Bytes()
}

func TestImport(t *testing.T) {
	e := newEnv(t)
	img := twoLayers(t)
	rootfs := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
		tw.WriteHeader(&tar.Header{Name: "bin/tool", Typeflag: tar.TypeReg, Mode: 0o755, Size: 4})
		io.WriteString(tw, "tool")
		tw.Close()
		return buf.Bytes()
	}()
	tests := []struct {
		name, tmpl   string
		body         []byte
		want         map[string]string
		wantDefaults bool
	}{
		{"rootfs tarball", "plain", rootfs, map[string]string{"bin": "/", "bin/tool": "tool"}, false},
		{"oci layout", "oci", archive(t, img, "oci"),
			map[string]string{"etc": "/", "etc/hello": "hello", "app": "/", "app/main": "main", "work": "/"}, true},
		{"docker save", "docker", archive(t, img, "docker"),
			map[string]string{"etc": "/", "etc/hello": "hello", "app": "/", "app/main": "main", "work": "/"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := e.svc.Import(t.Context(), tt.tmpl, bytes.NewReader(tt.body), ImportOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, files(t, e, tt.tmpl)); diff != "" {
				t.Errorf("tree (-want +got):\n%s", diff)
			}
			if got := tmpl.Defaults != nil && tmpl.Defaults.WorkingDir == "/work"; got != tt.wantDefaults || tmpl.Source != "import" {
				t.Errorf("template %+v, want defaults: %v", tmpl, tt.wantDefaults)
			}
		})
	}
	if entries, _ := os.ReadDir(filepath.Join(e.build, "tmp")); len(entries) != 0 {
		t.Errorf("imports left temporary files: %v", entries)
	}
}

func TestImportRefusesEscapingLayer(t *testing.T) {
	e := newEnv(t)
	bad := testImage(t, v1.Config{}, layer(t, member{"etc/", "/"}, member{"etc/../../escaped", "boo"}))
	for _, format := range []string{"oci", "docker"} {
		_, err := e.svc.Import(t.Context(), "bad-"+format, bytes.NewReader(archive(t, bad, format)), ImportOptions{})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "escapes") {
			t.Errorf("%s: import of an escaping layer: %v", format, err)
		}
		if _, err := e.m.Template(t.Context(), "bad-"+format); err == nil {
			t.Errorf("%s: a refused import left a template", format)
		}
	}
	// Nothing next to the templates: the fake storage keeps them all in
	// one directory.
	parent := filepath.Dir(filepath.Dir(e.storage.TemplatePath("x")))
	err := filepath.WalkDir(parent, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "escaped" {
			t.Errorf("escaped file written at %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBuildCachesAndCollects(t *testing.T) {
	e := newEnv(t)
	// No working directory: the fake driver runs RUN commands on the
	// host, in the step's working directory there.
	base := testImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, layer(t, member{"etc/", "/"}, member{"etc/hello", "hello"}))
	ref := push(t, startRegistry(t), "test/base:1", base)
	file := func(text string) []ociimage.Instruction {
		ins, err := ociimage.ParseBuildFile(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return ins
	}
	contextTar := func(body string) io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "greeting.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
		tw.Close()
		return &buf
	}
	dockerfile := "FROM " + ref + "\nENV STAGE=built\nRUN echo from-run\nWORKDIR /srv\nCOPY greeting.txt .\nUSER 0\n"
	var out strings.Builder
	tmpl, err := e.svc.Build(t.Context(), "built", BuildOptions{File: file(dockerfile), Context: contextTar("hello"), Out: &out})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	if got := files(t, e, "built")["srv/greeting.txt"]; got != "hello" {
		t.Errorf("copied file = %q\n%s", got, out.String())
	}
	if !strings.Contains(out.String(), "from-run") || !strings.Contains(out.String(), "ran steps 1, 3, 5 of 6") {
		t.Errorf("build output:\n%s", out.String())
	}
	want := &sandbox.Defaults{Env: []string{"PATH=/usr/bin:/bin", "STAGE=built"}, WorkingDir: "/srv", User: "0"}
	if diff := cmp.Diff(want, tmpl.Defaults); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if tmpl.Source != "build" || tmpl.Image != ref || len(tmpl.BuildKeys) != 3 {
		t.Errorf("template %+v", tmpl)
	}

	out.Reset()
	if _, err := e.svc.Build(t.Context(), "again", BuildOptions{File: file(dockerfile), Context: contextTar("hello"), Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "all 6 steps cached") {
		t.Errorf("unchanged rebuild:\n%s", out.String())
	}

	// A failing RUN names the step and its status. (The fake driver runs
	// commands on the host: this one changes nothing.)
	_, err = e.svc.Build(t.Context(), "fails", BuildOptions{File: file("FROM " + ref + "\nRUN exit 3\n")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "step 2/2 (line 2) RUN") || !strings.Contains(err.Error(), "status 3") {
		t.Errorf("failing RUN: %v", err)
	}
	_, err = e.svc.Build(t.Context(), "no-command", BuildOptions{File: file("FROM " + ref + "\nRUN [\"no-such-command-xyz\"]\n")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("RUN of a missing command: %v", err)
	}
	_, err = e.svc.Build(t.Context(), "bad-plan", BuildOptions{File: file("FROM " + ref + "\nCOPY missing.txt /\n")})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("COPY of a missing file: %v", err)
	}

	// Collection keeps what the templates need: both builds share the
	// base image and every step result.
	st, err := e.svc.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Blobs != 0 || st.Snapshots != 0 {
		t.Errorf("collection with the templates in place removed %+v", st)
	}
	for _, n := range []string{"built", "again"} {
		if err := e.m.DeleteTemplate(t.Context(), n); err != nil {
			t.Fatal(err)
		}
	}
	st, err = e.svc.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Blobs != 3 || st.Snapshots != 3 { // manifest, config, layer; FROM, RUN and COPY results
		t.Errorf("collection after deleting the templates removed %+v", st)
	}
	if keys, _ := e.svc.snaps.Keys(t.Context()); len(keys) != 0 {
		t.Errorf("snapshots left: %v", keys)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.build, "tmp")); len(entries) != 0 {
		t.Errorf("builds left temporary files: %v", entries)
	}
}

func TestClosedServiceRefuses(t *testing.T) {
	e := newEnv(t)
	if err := e.svc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Pull(t.Context(), "x", PullOptions{Ref: "example.test/x"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("pull after Close: %v", err)
	}
}

// TestGCWaitsWithoutBlocking: a collection waits for running operations,
// and new ones still start while it waits.
func TestGCWaitsWithoutBlocking(t *testing.T) {
	e := newEnv(t)
	_, end1, err := e.svc.begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.svc.GC(t.Context())
		done <- err
	}()
	// Let the collection start waiting: a blocked RWMutex.Lock would now
	// keep the next operation out.
	time.Sleep(300 * time.Millisecond)
	started := make(chan func(), 1)
	go func() {
		_, end2, err := e.svc.begin(t.Context())
		if err != nil {
			t.Error(err)
			started <- func() {}
			return
		}
		started <- end2
	}()
	select {
	case end2 := <-started:
		end2()
	case <-time.After(10 * time.Second):
		t.Fatal("an operation could not start while a collection waited")
	}
	select {
	case err := <-done:
		t.Fatalf("collection ran while an operation held the caches: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	end1()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("collection did not run after the operations ended")
	}
}
