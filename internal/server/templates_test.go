package server

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
	"github.com/corralrun/corral/internal/templates"
	corral "github.com/corralrun/corral/sdk"
)

// newImageServer is newTestServer with an image service.
func newImageServer(t *testing.T) *corral.Client {
	t.Helper()
	sock, err := os.MkdirTemp("", "srv-")
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
	m, err := sandbox.New(sandbox.Config{Store: st, Storage: storagefake.New(t.TempDir()), Drivers: []driver.Driver{drv}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	svc, err := templates.Open(templates.Config{Manager: m, CacheDir: t.TempDir(), BuildDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(Config{Manager: m, Images: svc, Version: "test", Storage: "fake"}).Handler())
	c, err := corral.New(ts.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		ts.Close()
		for _, sb := range m.List(context.Background(), sandbox.Filter{}) {
			_ = m.Delete(context.Background(), sb.ID)
		}
		svc.Close()
		m.Close()
		st.Close()
	})
	return c
}

// pushImage pushes a one-layer image with cfg to an in-process registry
// and returns its reference.
func pushImage(t *testing.T, cfg v1.Config, files map[string]string) (string, v1.Image) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Config, cf.OS, cf.Architecture = cfg, "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/img:1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref, img
}

func TestPullTemplateAPI(t *testing.T) {
	c := newImageServer(t)
	ctx := t.Context()
	work := t.TempDir() // the fake driver runs processes on the host
	ref, img := pushImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "GREETING=from-image"}, WorkingDir: work}, map[string]string{"hello": "hi"})
	var progress []corral.Progress
	var logs strings.Builder
	tmpl, err := c.PullTemplate(ctx, "pulled", corral.PullOptions{Ref: ref}, corral.StreamOptions{
		Log: &logs, Progress: func(p corral.Progress) { progress = append(progress, p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	if tmpl.Source != "pull" || tmpl.Digest != digest.String() || tmpl.Defaults == nil || tmpl.Defaults.WorkingDir != work {
		t.Fatalf("pulled template %+v", tmpl)
	}
	if len(progress) == 0 || !progress[len(progress)-1].Done || !strings.Contains(logs.String(), "pulled") {
		t.Errorf("progress %+v, log %q", progress, logs.String())
	}
	got, err := c.Template(ctx, "pulled")
	if err != nil || got.Defaults == nil || len(got.Defaults.Env) != 2 {
		t.Fatalf("GET template: %+v, %v", got, err)
	}
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "pulled", Env: map[string]string{"SANDBOX": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "echo $GREETING $SANDBOX; pwd", Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if want := "from-image yes\n" + work + "\n"; out.String() != want {
		t.Errorf("exec in a pulled template's sandbox printed %q, want %q", out.String(), want)
	}

	tests := []struct {
		name, tmpl, ref string
		code            string
		status          int
	}{
		{"existing name", "pulled", ref, corral.CodeAlreadyExists, http.StatusConflict},
		{"unknown tag", "other", strings.Replace(ref, ":1", ":2", 1), corral.CodeNotFound, http.StatusNotFound},
		{"bad reference", "other", "UPPER CASE", corral.CodeInvalidArgument, http.StatusBadRequest},
		{"no reference", "other", "", corral.CodeInvalidArgument, http.StatusBadRequest},
		{"bad name", "Bad Name", ref, corral.CodeInvalidArgument, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.PullTemplate(ctx, tt.tmpl, corral.PullOptions{Ref: tt.ref}, corral.StreamOptions{})
			var e *corral.Error
			if !errors.As(err, &e) || e.Code != tt.code || e.Status != tt.status {
				t.Errorf("error %v (%+v), want %s with status %d", err, e, tt.code, tt.status)
			}
		})
	}
}

func TestImportImageArchiveAPI(t *testing.T) {
	c := newImageServer(t)
	_, img := pushImage(t, v1.Config{User: "1000"}, map[string]string{"etc/motd": "welcome"})
	var buf bytes.Buffer
	r, _ := name.ParseReference("example.test/img:1")
	if err := tarball.Write(r, img, &buf); err != nil {
		t.Fatal(err)
	}
	tmpl, err := c.ImportTemplate(t.Context(), "saved", &buf)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Source != "import" || tmpl.Defaults == nil || tmpl.Defaults.User != "1000" || tmpl.Digest == "" {
		t.Errorf("imported template %+v", tmpl)
	}
	// A plain root file system still imports as before.
	if tmpl, err := c.ImportTemplate(t.Context(), "plain", emptyTar()); err != nil || tmpl.Defaults != nil {
		t.Errorf("rootfs import: %+v, %v", tmpl, err)
	}
}

func TestBuildDockerfileAPI(t *testing.T) {
	c := newImageServer(t)
	ctx := t.Context()
	ref, _ := pushImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, map[string]string{"etc/base": "base"})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.txt"), []byte("app"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	df := "FROM " + ref + "\nARG WHO=nobody\nENV WHO=$WHO\nCOPY app.txt /opt/\nRUN echo built by $WHO\n"
	tmpl, err := c.BuildTemplateFromDockerfile(ctx, "built", corral.DockerfileOptions{
		Dockerfile: []byte(df), ContextDir: dir, Args: map[string]string{"WHO": "test"},
	}, corral.StreamOptions{Log: &logs})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, logs.String())
	}
	if tmpl.Source != "build" || tmpl.Defaults == nil || !strings.Contains(strings.Join(tmpl.Defaults.Env, " "), "WHO=test") {
		t.Errorf("built template %+v", tmpl)
	}
	for _, want := range []string{"step 4/5: COPY app.txt /opt/", "built by test", "ran steps 1, 4, 5 of 5"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("build log lacks %q:\n%s", want, logs.String())
		}
	}

	tests := []struct {
		name, tmpl, file string
		code             string
		status           int
		msg              string
	}{
		{"unparsable", "x", "FROM " + ref + "\nFROB x\n", corral.CodeInvalidArgument, http.StatusBadRequest, "line 2"},
		{"unsupported", "x", "FROM " + ref + "\nHEALTHCHECK NONE\n", corral.CodeNotImplemented, http.StatusNotImplemented, "line 2"},
		{"existing name", "built", "FROM " + ref + "\n", corral.CodeAlreadyExists, http.StatusConflict, "exists"},
		{"failing run", "x", "FROM " + ref + "\nRUN true\nRUN exit 7\n", corral.CodeFailedPrecondition, 200, "status 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.BuildTemplateFromDockerfile(ctx, tt.tmpl, corral.DockerfileOptions{Dockerfile: []byte(tt.file)}, corral.StreamOptions{})
			var e *corral.Error
			if !errors.As(err, &e) || e.Code != tt.code || e.Status != tt.status || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("error %v (%+v), want %s, status %d, mentioning %q", err, e, tt.code, tt.status, tt.msg)
			}
		})
	}
	// A context directory that cannot be read fails on the client.
	_, err = c.BuildTemplateFromDockerfile(ctx, "x", corral.DockerfileOptions{Dockerfile: []byte("FROM scratch\n"), ContextDir: filepath.Join(dir, "missing")}, corral.StreamOptions{})
	if err == nil || !strings.Contains(err.Error(), "sending the build") {
		t.Errorf("missing context dir: %v", err)
	}
	// The recipe mode is unchanged.
	if _, err := c.BuildTemplate(ctx, "recipe", corral.BuildOptions{Recipe: "nope"}, nil); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Errorf("unknown recipe: %v", err)
	}
}

func TestImagesNotConfigured(t *testing.T) {
	c, _ := newTestServer(t, "")
	_, err := c.PullTemplate(t.Context(), "x", corral.PullOptions{Ref: "example.test/x"}, corral.StreamOptions{})
	if corral.ErrorCode(err) != corral.CodeNotImplemented {
		t.Errorf("pull without an image service: %v", err)
	}
}
