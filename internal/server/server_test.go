package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/secrets"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
	"github.com/corralrun/corral/internal/tenancy"
	corral "github.com/corralrun/corral/sdk"
)

// newTestServer serves the API over a Manager with the fake driver, the
// fake storage and a real SQLite store, and returns an SDK client for it.
// mods change the Manager's configuration.
func newTestServer(t testing.TB, apiKey string, mods ...func(*sandbox.Config)) (*corral.Client, *httptest.Server) {
	t.Helper()
	return newTestServerWith(t, apiKey, nil, mods...)
}

// newTestServerWith is newTestServer with srvMod, when not nil, changing
// the server's configuration.
func newTestServerWith(t testing.TB, apiKey string, srvMod func(*Config), mods ...func(*sandbox.Config)) (*corral.Client, *httptest.Server) {
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
	cfg := sandbox.Config{Store: st, Storage: storagefake.New(t.TempDir()), Drivers: []driver.Driver{drv},
		Defaults: sandbox.Limits{MilliCPUs: 500, MemoryBytes: 128 << 20, Pids: 64}, Metrics: metrics.NewRegistry(),
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots")}
	for _, mod := range mods {
		mod(&cfg)
	}
	m, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var keys *tenancy.Keys
	if apiKey != "" {
		if keys, err = tenancy.NewKeys(t.Context(), tenancy.NewMemStore(), apiKey); err != nil {
			t.Fatal(err)
		}
	}
	sec, err := secrets.Open(st, filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	// A Manager that audits commands has a server that audits calls.
	auditLog, _ := cfg.Audit.(*audit.Log)
	scfg := Config{Manager: m, Version: "test", Storage: "fake", Metrics: cfg.Metrics, Keys: keys, Secrets: sec, Audit: auditLog}
	if srvMod != nil {
		srvMod(&scfg)
	}
	s := New(scfg)
	h := s.Handler()
	if apiKey != "" {
		if h, err = s.AuthHandler(apiKey); err != nil {
			t.Fatal(err)
		}
	}
	ts := httptest.NewServer(h)
	c, err := corral.New(ts.URL, apiKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		ts.Close()
		for _, sb := range m.List(context.Background(), sandbox.Filter{Pooled: true}) {
			_ = m.Delete(context.Background(), sb.ID)
		}
		m.Close()
		st.Close()
	})
	if _, err := c.BuildTemplate(t.Context(), "bb", corral.BuildOptions{Recipe: "busybox"}, nil); err != nil {
		// The busybox recipe needs /bin/busybox; fall back to an import of
		// an empty tree so API tests run anywhere.
		if _, err := c.ImportTemplate(t.Context(), "bb", emptyTar()); err != nil {
			t.Fatal(err)
		}
	}
	return c, ts
}

func emptyTar() io.Reader { return bytes.NewReader(make([]byte, 1024)) }

func TestSandboxLifecycleOverHTTP(t *testing.T) {
	c, _ := newTestServer(t, "")
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", CPUs: 0.25, Metadata: map[string]string{"team": "a"}, Env: map[string]string{"X": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "running" || sb.CPUs != 0.25 || sb.MemoryMB != 128 || sb.Pids != 64 || sb.Deadline == nil {
		t.Fatalf("created %+v", sb)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sb, got); diff != "" {
		t.Fatalf("get differs from create (-create +get):\n%s", diff)
	}
	list, err := c.List(ctx, corral.ListOptions{Metadata: map[string]string{"team": "a"}, State: "running"})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	if list, _ := c.List(ctx, corral.ListOptions{Metadata: map[string]string{"team": "b"}}); len(list) != 0 {
		t.Fatalf("metadata filter matched %v", list)
	}
	if _, err := c.List(ctx, corral.ListOptions{State: "bogus"}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("bad state filter: %v", err)
	}
	var out, errOut bytes.Buffer
	res, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "echo $X; echo oops >&2; exit 3", Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || out.String() != "1\n" || errOut.String() != "oops\n" || res.PID == 0 {
		t.Fatalf("exec: %+v %q %q", res, out.String(), errOut.String())
	}
	if _, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"definitely-not-a-command"}}); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("missing executable: %v", err)
	}
	if _, err := c.Exec(ctx, sb.ID, corral.ExecOptions{}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("exec with neither cmd nor shell: %v", err)
	}
	if _, err := c.SetTimeout(ctx, sb.ID, -5e9); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("negative timeout: %v", err)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
}

func TestFilesOverHTTP(t *testing.T) {
	c, _ := newTestServer(t, "")
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("hello\x00world")
	fi, err := c.WriteFile(ctx, sb.ID, "/a/b/c.txt", bytes.NewReader(data), 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode != 0o640 || fi.Size != int64(len(data)) {
		t.Fatalf("written %+v", fi)
	}
	r, err := c.ReadFile(ctx, sb.ID, "/a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, data) {
		t.Fatalf("read %q", got)
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/nope"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, ""); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("no path: %v", err)
	}
}

func TestErrorsAreJSON(t *testing.T) {
	_, ts := newTestServer(t, "")
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown route", "GET", "/v2/nothing", "", 404, "not_found"},
		{"bad json", "POST", "/v1/sandboxes", "{", 400, "invalid_argument"},
		{"unknown field", "POST", "/v1/sandboxes", `{"template":"bb","cpu":1}`, 400, "invalid_argument"},
		{"trailing data", "POST", "/v1/sandboxes", `{"template":"bb"} {}`, 400, "invalid_argument"},
		{"negative memory", "POST", "/v1/sandboxes", `{"template":"bb","memory_mb":-1}`, 400, "invalid_argument"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 404, "not_found"},
		{"missing timeout", "POST", "/v1/sandboxes/x/timeout", `{}`, 400, "invalid_argument"},
		{"bad mode", "PUT", "/v1/sandboxes/x/files?path=/a&mode=999", "", 400, "invalid_argument"},
		{"bad recipe", "POST", "/v1/templates/t/build", `{"recipe":"gentoo"}`, 400, "invalid_argument"},
		{"bad template name", "POST", "/v1/templates/UPPER/build", `{"recipe":"busybox"}`, 400, "invalid_argument"},
		{"template exists", "POST", "/v1/templates/bb/build", `{"recipe":"busybox"}`, 409, "already_exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := send(t, tt.method, ts.URL+tt.path, tt.body)
			if resp.StatusCode != tt.status || !strings.Contains(string(b), `"code":"`+tt.code+`"`) {
				t.Fatalf("status %d body %s; want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
		})
	}
}

// send makes a request with body and returns the response and its body,
// read and closed.
func send(t *testing.T, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestAuth(t *testing.T) {
	c, ts := newTestServer(t, "k3y")
	if _, err := c.List(t.Context(), corral.ListOptions{}); err != nil {
		t.Fatalf("with key: %v", err)
	}
	bad, _ := corral.New(ts.URL, "wrong")
	defer bad.Close()
	if _, err := bad.List(t.Context(), corral.ListOptions{}); corral.ErrorCode(err) != corral.CodeUnauthenticated {
		t.Fatalf("wrong key: %v", err)
	}
	if _, err := New(Config{}).AuthHandler(""); err == nil {
		t.Fatal("AuthHandler accepted an empty key")
	}
	// The scheme of the Authorization header is matched regardless of
	// case; the key is not.
	for _, tt := range []struct {
		name, header, value string
		want                int
	}{
		{"bearer", "Authorization", "Bearer k3y", http.StatusOK},
		{"lower-case scheme", "Authorization", "bearer k3y", http.StatusOK},
		{"upper-case scheme", "Authorization", "BEARER k3y", http.StatusOK},
		{"two spaces", "Authorization", "Bearer  k3y", http.StatusOK},
		{"x-api-key", "X-API-Key", "k3y", http.StatusOK},
		{"wrong key, lower-case scheme", "Authorization", "bearer nope", http.StatusUnauthorized},
		{"key of another case", "Authorization", "Bearer K3Y", http.StatusUnauthorized},
		{"another scheme", "Authorization", "Basic k3y", http.StatusUnauthorized},
		{"no space", "Authorization", "Bearerk3y", http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, ts.URL+"/v1/sandboxes", nil)
			req.Header.Set(tt.header, tt.value)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, b)
			}
		})
	}
}

func TestCredentials(t *testing.T) {
	tests := []struct {
		name, auth, scheme string
		want               string
		ok                 bool
	}{
		{"bearer", "Bearer tok", "Bearer", "tok", true},
		{"lower case", "bearer tok", "Bearer", "tok", true},
		{"mixed case", "bEaReR tok", "Bearer", "tok", true},
		{"several spaces", "Bearer   tok", "Bearer", "tok", true},
		{"basic", "basic dTo=", "Basic", "dTo=", true},
		{"other scheme", "Basic dTo=", "Bearer", "", false},
		{"scheme only", "Bearer", "Bearer", "", false},
		{"longer scheme", "Bearers tok", "Bearer", "", false},
		{"no header", "", "Bearer", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.auth != "" {
				h.Set("Authorization", tt.auth)
			}
			got, ok := Credentials(h, tt.scheme)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("Credentials(%q, %q) = %q, %v; want %q, %v", tt.auth, tt.scheme, got, ok, tt.want, tt.ok)
			}
		})
	}
}
