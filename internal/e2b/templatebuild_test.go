package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/templates"
)

// fakeBuilder records the builds it is given and makes each a template
// of the Manager; a RUN step whose command is "fail" fails as a step of
// a real build does.
type fakeBuilder struct {
	m    *sandbox.Manager
	mu   sync.Mutex
	last templates.BuildOptions
}

func (f *fakeBuilder) Build(ctx context.Context, name string, opts templates.BuildOptions) (sandbox.Template, error) {
	f.mu.Lock()
	f.last = opts
	f.mu.Unlock()
	for _, ins := range opts.File {
		fmt.Fprintf(opts.Out, "step: %s\n", ins.Text)
		if ins.Cmd == "RUN" && ins.Args == "fail" {
			return sandbox.Template{}, &ociimage.LineError{Line: ins.Line, Err: errdefs.Errorf(errdefs.ErrFailedPrecondition, "command exited with status 3")}
		}
	}
	fmt.Fprint(opts.Out, "partial line without newline")
	return f.m.CreateTemplate(ctx, name, "build", func(dir string) error { return os.MkdirAll(filepath.Join(dir, "root"), 0o755) })
}

// buildEnv is the facade with template builds on a fake builder.
func buildEnv(t *testing.T) (*env, *Server, *fakeBuilder, string) {
	e := newEnv(t)
	fb := &fakeBuilder{m: e.m}
	srv, err := New(Config{Manager: e.m, APIKey: testKey, Templates: fb, BuildDir: t.TempDir(), MaxUploadBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	return &env{t: t, ts: ts, srv: srv, m: e.m}, srv, fb, ts.URL
}

// tarOf is a tar of one file.
func tarOf(t *testing.T, name, body string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, body)
	tw.Close()
	return buf.Bytes()
}

func put(t *testing.T, u string, body []byte) int {
	req, _ := http.NewRequest(http.MethodPut, u, bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTemplateBuildFlow follows the SDK's calls: name a build, upload a
// COPY step's files through the signed URL (refused when forged, expired
// or too large unpacked), start it, poll its status and logs, resolve its
// tags; a failing step names its number.
func TestTemplateBuildFlow(t *testing.T) {
	e, srv, fb, base := buildEnv(t)
	var named map[string]any
	if code := e.api("POST", "/v3/templates", `{"name":"app:v1","tags":["x"]}`, &named); code != 202 || named["buildID"] != "app" || named["templateID"] != "app" {
		t.Fatalf("request build: %d %v", code, named)
	}
	hash := strings.Repeat("0f", 32)
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if code := e.api("GET", "/templates/app/files/"+hash, "", &link); code != 201 || link.Present || link.URL == "" {
		t.Fatalf("upload link: %d %+v", code, link)
	}
	u, _ := url.Parse(link.URL)
	u.Scheme, u.Host = "http", strings.TrimPrefix(base, "http://")
	forged := *u
	q := forged.Query()
	q.Set("signature", "x")
	forged.RawQuery = q.Encode()
	expired := *u
	past := fmt.Sprint(time.Now().Add(-time.Minute).Unix())
	q = expired.Query()
	q.Set("expires", past)
	q.Set("signature", srv.uploadSignature(hash, past))
	expired.RawQuery = q.Encode()
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	zw.Write(tarOf(t, "zeros", strings.Repeat("\x00", 1<<20)))
	zw.Close()
	for _, c := range []struct {
		what string
		url  string
		body []byte
		want int
	}{
		{"forged", forged.String(), tarOf(t, "app/hello.txt", "hi"), 401},
		{"expired", expired.String(), tarOf(t, "app/hello.txt", "hi"), 401},
		{"too large unpacked", u.String(), bomb.Bytes(), 400},
		{"good", u.String(), tarOf(t, "app/hello.txt", "hi"), 200},
	} {
		if code := put(t, c.url, c.body); code != c.want {
			t.Errorf("%s upload: %d, want %d", c.what, code, c.want)
		}
	}
	if code := e.api("GET", "/templates/app/files/"+hash, "", &link); code != 201 || !link.Present {
		t.Fatalf("after the upload: %d %+v", code, link)
	}

	body := fmt.Sprintf(`{"fromTemplate":"bb","startCmd":"serve","readyCmd":"true","steps":[{"type":"COPY","args":["app","/srv/","",""],"filesHash":%q}]}`, hash)
	if code := e.api("POST", "/v2/templates/app/builds/app", body, nil); code != 202 {
		t.Fatalf("start: %d", code)
	}
	if code := e.api("POST", "/v2/templates/app/builds/app", body, nil); code != 409 {
		t.Errorf("second start: %d, want 409", code)
	}
	st := waitBuild(t, e, "app", "app")
	if st.Status != "ready" || len(st.Logs) != 3 || st.Logs[2].Message != "partial line without newline" {
		t.Fatalf("status %+v", st)
	}
	fb.mu.Lock()
	opts := fb.last
	fb.mu.Unlock()
	if opts.Service == nil || opts.Service.Shell != "serve" || opts.File[0].FromTemplate != "bb" || opts.File[1].JSON[0] != hash+"/app" {
		t.Errorf("build options: %+v", opts)
	}
	var rest struct {
		Logs []logEntry `json:"logEntries"`
	}
	if e.api("GET", "/templates/app/builds/app/status?logsOffset=2", "", &rest); len(rest.Logs) != 1 {
		t.Errorf("logs after offset 2: %+v", rest.Logs)
	}
	for _, ref := range []string{"app", "app:v1", "app:x"} {
		if code := e.api("GET", "/templates/aliases/"+url.PathEscape(ref), "", nil); code != 200 {
			t.Errorf("alias %s: %d", ref, code)
		}
	}
	var tags []map[string]any
	if code := e.api("GET", "/templates/app/tags", "", &tags); code != 200 || len(tags) != 2 {
		t.Errorf("tags: %d %v", code, tags)
	}

	if code := e.api("POST", "/v3/templates", `{"name":"app:broken"}`, &named); code != 202 || named["buildID"] == "app" {
		t.Fatalf("second build of a name: %d %v, want a new build ID", code, named)
	}
	id := named["buildID"].(string)
	if code := e.api("POST", "/v2/templates/app/builds/"+id, `{"fromTemplate":"app","steps":[{"type":"ENV","args":["A","1"]},{"type":"RUN","args":["fail"]}]}`, nil); code != 202 {
		t.Fatalf("start of the failing build: %d", code)
	}
	if st := waitBuild(t, e, "app", id); st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" || !strings.Contains(st.Reason.Message, "status 3") {
		t.Errorf("failing build: %+v", st)
	}
	if code := e.api("GET", "/templates/aliases/app:broken", "", nil); code != 404 {
		t.Errorf("the tag of a failed build: %d, want 404", code)
	}
}

type buildStatusBody struct {
	Status string       `json:"status"`
	Logs   []logEntry   `json:"logEntries"`
	Reason *buildReason `json:"reason"`
}

// waitBuild polls a build's status until it ends.
func waitBuild(t *testing.T, e *env, name, id string) buildStatusBody {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var st buildStatusBody
		if code := e.api("GET", "/templates/"+name+"/builds/"+id+"/status", "", &st); code != 200 {
			t.Fatalf("status: %d", code)
		}
		if st.Status == "ready" || st.Status == "error" {
			return st
		}
	}
	t.Fatal("the build did not end")
	return buildStatusBody{}
}

// TestCollectFiles: uploads older than filesRetention go, newer ones
// stay, and nothing goes while a build runs.
func TestCollectFiles(t *testing.T) {
	_, srv, _, _ := buildEnv(t)
	old, fresh := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	for _, h := range []string{old, fresh} {
		if err := os.MkdirAll(filepath.Join(srv.filesDir(), h, "app"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	then := time.Now().Add(-2 * filesRetention)
	if err := os.Chtimes(filepath.Join(srv.filesDir(), old), then, then); err != nil {
		t.Fatal(err)
	}
	srv.builds.m["running"] = &build{status: "building"}
	srv.collectFiles(time.Now())
	if !srv.uploaded(old) {
		t.Fatal("files collected while a build runs")
	}
	delete(srv.builds.m, "running")
	srv.collectFiles(time.Now())
	if srv.uploaded(old) || !srv.uploaded(fresh) {
		t.Errorf("after collect: old there %v, fresh there %v", srv.uploaded(old), srv.uploaded(fresh))
	}
}
