package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/server"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
	corral "github.com/corralrun/corral/sdk"
)

// api serves the REST API over a Manager with the fake driver (whose
// processes run on the host, and whose files live in the sandbox's root
// directory) and returns a client for it, with template "bb".
func api(t testing.TB) *corral.Client {
	c, _ := apiRoots(t)
	return c
}

// apiRoots is api with mods applied to the Manager's configuration; it
// also returns the directory holding each sandbox's root (ID/ below it).
func apiRoots(t testing.TB, mods ...func(*sandbox.Config)) (*corral.Client, string) {
	t.Helper()
	sock, err := os.MkdirTemp("", "mcp-")
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
	reg := metrics.NewRegistry()
	storage := t.TempDir()
	cfg := sandbox.Config{Store: st, Storage: storagefake.New(storage), Drivers: []driver.Driver{drv},
		Defaults: sandbox.Limits{MilliCPUs: 500, MemoryBytes: 128 << 20, Pids: 64}, Metrics: reg,
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
	ts := httptest.NewServer(server.New(server.Config{Manager: m, Version: "test", Storage: "fake", Metrics: reg}).Handler())
	c, err := corral.New(ts.URL, "")
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
	// An empty root: the fake driver runs processes on the host.
	if _, err := c.ImportTemplate(t.Context(), "bb", bytes.NewReader(make([]byte, 1024))); err != nil {
		t.Fatal(err)
	}
	return c, filepath.Join(storage, "roots")
}

// client is an MCP client session with a Server over the in-memory
// transport.
type client struct {
	*mcp.ClientSession
	srv  *Server
	done chan error // Run's result once the session ended
}

// connect starts a Server with policy p on c and connects a client.
func connect(t *testing.T, c *corral.Client, p Policy) *client {
	t.Helper()
	if p.Template == "" {
		p.Template = "bb"
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Client: func(http.Header) (*corral.Client, error) { return c, nil }, Policy: p,
		Logger: slog.New(slog.DiscardHandler)})
	st, ct := mcp.NewInMemoryTransports()
	s := &client{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Run(context.Background(), st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.ClientSession = cs
	t.Cleanup(func() { s.end(t) })
	return s
}

// end closes the client side and waits for the server to clean up.
func (s *client) end(t *testing.T) {
	t.Helper()
	if s.ClientSession == nil {
		return
	}
	s.Close()
	s.ClientSession = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the server did not see the session end")
	}
	s.srv.Close()
}

// call calls a tool and returns its result.
func (s *client) call(t *testing.T, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v", name, err)
	}
	return res
}

// ok calls a tool that must succeed and returns its text.
func (s *client) ok(t *testing.T, name string, args map[string]any) (string, map[string]any) {
	t.Helper()
	res := s.call(t, name, args)
	if res.IsError {
		t.Fatalf("%s %v: %s", name, args, text(res))
	}
	return text(res), structured(t, res)
}

// fails calls a tool that must fail with code.
func (s *client) fails(t *testing.T, code, name string, args map[string]any) string {
	t.Helper()
	res := s.call(t, name, args)
	if !res.IsError {
		t.Fatalf("%s %v succeeded: %s", name, args, text(res))
	}
	got := text(res)
	if !strings.HasPrefix(got, "error "+code+": ") {
		t.Fatalf("%s %v: got %q, want code %s", name, args, got, code)
	}
	if e, _ := structured(t, res)["error"].(map[string]any); e["code"] != code {
		t.Fatalf("%s: structured error %v, want code %s", name, e, code)
	}
	return got
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// structured returns a result's structured content as JSON decodes it.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return m
}

func TestToolsAreListedWithSchemas(t *testing.T) {
	s := connect(t, api(t), Policy{})
	res, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil || tool.Annotations == nil {
			t.Errorf("tool %s lacks a description, schema or annotations", tool.Name)
		}
	}
	want := []string{"code_context_create", "exec", "files_list", "files_read", "files_remove", "files_write", "fork",
		"port_url", "process_kill", "process_list", "process_output", "process_start", "run_code", "sandbox_create",
		"sandbox_kill", "sandbox_list", "sandbox_pause", "sandbox_resume", "snapshot"}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
}

// TestSessionSandbox checks that exec without a sandbox uses one sandbox
// per session, made on first use, and that it is gone when the session
// ends.
func TestSessionSandbox(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{})
	out, st := s.ok(t, "exec", map[string]any{"command": "echo hi; echo err >&2; exit 3"})
	if out != "exit_code: 3\nstdout:\nhi\nstderr:\nerr\n" || st["exit_code"] != 3.0 {
		t.Fatalf("exec: %q %v", out, st)
	}
	id := st["sandbox_id"].(string)
	_, st = s.ok(t, "exec", map[string]any{"command": "true", "stdin": "x", "env": map[string]string{"A": "1"}})
	if st["sandbox_id"] != id {
		t.Fatalf("second exec ran in %v, not the session's %s", st["sandbox_id"], id)
	}
	sb, err := c.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Template != "bb" || sb.Metadata[SessionKey] == "" || sb.Network == nil || sb.Network.Mode != "none" ||
		sb.IdleTimeout != 1800 || sb.Deadline != nil {
		t.Fatalf("session sandbox %+v", sb)
	}
	if list, _ := s.ok(t, "sandbox_list", nil); !strings.Contains(list, id+": running") || !strings.Contains(list, "(session:") {
		t.Fatalf("sandbox_list: %q", list)
	}
	// A session sandbox deleted behind the session's back is replaced.
	if err := c.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	_, st = s.ok(t, "exec", map[string]any{"command": "true"})
	if id2 := st["sandbox_id"].(string); id2 == id {
		t.Fatal("exec used a deleted sandbox")
	} else {
		id = id2
	}
	s.end(t)
	if _, err := c.Get(t.Context(), id); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("session sandbox after the session: %v", err)
	}
}

func TestExecOutputIsClipped(t *testing.T) {
	s := connect(t, api(t), Policy{})
	out, st := s.ok(t, "exec", map[string]any{"command": "head -c 30000 /dev/zero | tr '\\0' a; echo; echo END",
		"max_output_bytes": 1000})
	if !strings.Contains(out, "[... 29005 bytes left out ...]") || !strings.HasSuffix(strings.Split(out, "\nnote:")[0], "aaa\nEND") ||
		!strings.Contains(out, "note: 29005 of 30005 bytes of stdout left out") || st["stdout_bytes"] != 30005.0 {
		t.Fatalf("clipped output: %q", out)
	}
	out, _ = s.ok(t, "exec", map[string]any{"command": "sleep 5", "timeout_seconds": 1})
	if !strings.Contains(out, "killed after 1s") {
		t.Fatalf("timeout: %q", out)
	}
}

func TestErrorsAreToolErrors(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{})
	s.fails(t, "not_found", "exec", map[string]any{"command": "true", "sandbox_id": "sb-nope"})
	s.fails(t, "invalid_argument", "exec", map[string]any{"command": " "})
	s.fails(t, "invalid_argument", "exec", map[string]any{"command": "true", "timeout_seconds": -1})
	s.fails(t, "invalid_argument", "files_read", map[string]any{"path": "/x", "offset": -1})
	s.fails(t, "invalid_argument", "files_write", map[string]any{"path": "/x", "content": "%%", "encoding": "base64"})
	s.fails(t, "invalid_argument", "files_write", map[string]any{"path": "/x", "content": "", "mode": "999"})
	s.fails(t, "invalid_argument", "process_output", map[string]any{"pid": 0})
	s.fails(t, "not_found", "sandbox_kill", map[string]any{"sandbox_id": "sb-nope"})
	// Arguments that do not fit the schema are the same tool errors.
	s.fails(t, "invalid_argument", "exec", map[string]any{"command": 5})
	s.fails(t, "invalid_argument", "files_read", map[string]any{})
	s.fails(t, "invalid_argument", "files_read", map[string]any{"path": "/x", "offset": "ten"})
	s.fails(t, "invalid_argument", "exec", map[string]any{"command": "true", "comand": "typo"})

	// A daemon that is down: each call says so, promptly.
	down, err := corral.New("unix://"+filepath.Join(t.TempDir(), "none.sock"), "")
	if err != nil {
		t.Fatal(err)
	}
	d := connect(t, down, Policy{})
	msg := d.fails(t, "unavailable", "exec", map[string]any{"command": "true"})
	if !strings.Contains(msg, "cannot reach the Corral daemon") {
		t.Fatalf("daemon down: %q", msg)
	}
	d.fails(t, "unavailable", "sandbox_list", nil)
}

func TestPolicyBoundsClients(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{Runtimes: []string{"fake"}, MaxSandboxes: 2,
		Network: corral.NetworkPolicy{Mode: corral.NetworkAllowlist, AllowDomains: []string{"*.example.com", "api.test:8443"}, AllowCIDRs: []string{"10.1.0.0/16"}}})
	s.fails(t, "permission_denied", "sandbox_create", map[string]any{"runtime": "gvisor"})
	s.fails(t, "permission_denied", "sandbox_create", map[string]any{"network": map[string]any{"mode": "open"}})
	s.fails(t, "permission_denied", "sandbox_create", map[string]any{"network": map[string]any{"allow_domains": []string{"evil.test"}}})
	s.fails(t, "permission_denied", "sandbox_create", map[string]any{"network": map[string]any{"allow_cidrs": []string{"10.0.0.0/8"}}})
	s.fails(t, "invalid_argument", "sandbox_create", map[string]any{"network": map[string]any{"mode": "wide"}})

	// What the ceiling covers passes (the fake driver has no network to
	// create it with).
	got, err := s.srv.network(NetworkIn{AllowDomains: []string{"a.example.com"}, AllowCIDRs: []string{"10.1.2.0/24:443"}})
	if err != nil || got.Mode != "allowlist" || !slices.Equal(got.AllowDomains, []string{"a.example.com"}) {
		t.Fatalf("network within the ceiling: %+v, %v", got, err)
	}
	if got, err := s.srv.network(NetworkIn{}); err != nil || !slices.Equal(got.AllowDomains, []string{"*.example.com", "api.test:8443"}) {
		t.Fatalf("no network asked: %+v, %v", got, err)
	}

	// The session sandbox counts: two is the limit.
	l := connect(t, c, Policy{MaxSandboxes: 2})
	_, st := l.ok(t, "sandbox_create", nil)
	id := st["sandbox_id"].(string)
	l.ok(t, "exec", map[string]any{"command": "true"})
	l.fails(t, "resource_exhausted", "sandbox_create", nil)
	l.fails(t, "resource_exhausted", "fork", map[string]any{"sandbox_id": id})
	// Sandboxes made elsewhere do not count; deleted ones stop counting.
	if _, err := c.Create(t.Context(), corral.CreateOptions{Template: "bb"}); err != nil {
		t.Fatal(err)
	}
	l.ok(t, "sandbox_kill", map[string]any{"sandbox_id": id})
	_, st = l.ok(t, "sandbox_create", map[string]any{"cpus": 0.25, "timeout_seconds": 60})
	if sb, _ := c.Get(t.Context(), st["sandbox_id"].(string)); sb == nil || sb.CPUs != 0.25 || sb.Network.Mode != "none" || sb.Deadline == nil {
		t.Fatalf("default network or limits not applied: %+v", sb)
	}

	// Without any network of its own, a client gets none.
	n := connect(t, c, Policy{})
	n.fails(t, "permission_denied", "sandbox_create", map[string]any{"network": map[string]any{"allow_domains": []string{"a.test"}}})
	n.ok(t, "sandbox_create", map[string]any{"network": map[string]any{"mode": "none"}})
}

func TestCovers(t *testing.T) {
	for _, tt := range []struct {
		name, have, want string
		domain, covered  bool
	}{
		{"same name", "a.test", "a.test", true, true},
		{"names differ in case", "A.test", "a.TEST", true, true},
		{"other name", "a.test", "b.test", true, false},
		{"wildcard", "*.a.test", "x.y.a.test", true, true},
		{"wildcard in wildcard", "*.a.test", "*.b.a.test", true, true},
		{"wildcard is not the parent", "*.a.test", "a.test", true, false},
		{"wildcard suffix trick", "*.a.test", "xa.test", true, false},
		{"default ports", "a.test", "a.test:443", true, true},
		{"port outside", "a.test", "a.test:22", true, false},
		{"ports inside", "a.test:80,443,8080", "a.test:8080", true, true},
		{"default beyond ports", "a.test:443", "a.test", true, false},
		{"bad port", "a.test", "a.test:x", true, false},
		{"range holds", "10.0.0.0/8", "10.2.0.0/16", false, true},
		{"address in range", "10.0.0.0/8", "10.2.3.4", false, true},
		{"range wider", "10.2.0.0/16", "10.0.0.0/8", false, false},
		{"range elsewhere", "10.0.0.0/8", "192.168.0.0/16", false, false},
		{"any port holds some", "10.0.0.0/8", "10.0.0.1:22", false, true},
		{"some ports do not hold all", "10.0.0.0/8:443", "10.0.0.1", false, false},
		{"not an address", "10.0.0.0/8", "ten", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := cidrCovers(tt.have, tt.want)
			if tt.domain {
				got = domainCovers(tt.have, tt.want)
			}
			if got != tt.covered {
				t.Fatalf("%q covers %q: %v, want %v", tt.have, tt.want, got, tt.covered)
			}
		})
	}
}

func TestFiles(t *testing.T) {
	s := connect(t, api(t), Policy{})
	s.ok(t, "files_write", map[string]any{"path": "/work/notes.txt", "content": "héllo\nworld\n"})
	out, st := s.ok(t, "files_read", map[string]any{"path": "/work/notes.txt"})
	if out != "héllo\nworld\n" || st["encoding"] != "text" {
		t.Fatalf("read: %q %v", out, st)
	}
	// A part, cut before a character that does not fit whole.
	out, st = s.ok(t, "files_read", map[string]any{"path": "/work/notes.txt", "length": 2})
	if out != "h\n[bytes 0 to 1 of 13; read on with offset=1]\n" || st["end"] != 1.0 {
		t.Fatalf("part: %q", out)
	}
	out, _ = s.ok(t, "files_read", map[string]any{"path": "/work/notes.txt", "offset": 1, "length": 2})
	if out != "é\n[bytes 1 to 3 of 13; read on with offset=3]\n" {
		t.Fatalf("part from an offset: %q", out)
	}
	s.ok(t, "files_write", map[string]any{"path": "/work/bin", "content": "AAEC/w==", "encoding": "base64", "mode": "755"})
	if out, _ = s.ok(t, "files_read", map[string]any{"path": "/work/bin"}); out != "(binary content, base64)\nAAEC/w==" {
		t.Fatalf("binary: %q", out)
	}
	var img bytes.Buffer
	pic := image.NewRGBA(image.Rect(0, 0, 2, 2))
	pic.Set(0, 0, color.RGBA{R: 255, A: 255})
	if err := png.Encode(&img, pic); err != nil {
		t.Fatal(err)
	}
	s.ok(t, "files_write", map[string]any{"path": "/work/dot.png", "content": b64(img.Bytes()), "encoding": "base64"})
	res := s.call(t, "files_read", map[string]any{"path": "/work/dot.png"})
	if len(res.Content) != 2 {
		t.Fatalf("image read: %d content items", len(res.Content))
	}
	if ic, ok := res.Content[1].(*mcp.ImageContent); !ok || ic.MIMEType != "image/png" || !bytes.Equal(ic.Data, img.Bytes()) {
		t.Fatalf("image content: %#v", res.Content[1])
	}
	out, st = s.ok(t, "files_list", map[string]any{"path": "/work"})
	for _, want := range []string{"file             4  bin\n", "file            13  notes.txt\n", "dot.png\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("list lacks %q: %q", want, out)
		}
	}
	if st["count"] != 3.0 {
		t.Fatalf("list: %v", st)
	}
	s.fails(t, "invalid_argument", "files_read", map[string]any{"path": "/work"})
	s.ok(t, "files_remove", map[string]any{"path": "/work", "recursive": true})
	s.fails(t, "not_found", "files_read", map[string]any{"path": "/work/notes.txt"})
}

func TestProcesses(t *testing.T) {
	s := connect(t, api(t), Policy{})
	_, st := s.ok(t, "process_start", map[string]any{"command": "sleep 0.3; echo one; sleep 0.3; echo two >&2; sleep 60", "tag": "job"})
	pid := st["pid"]
	// A wait returns with the first output.
	out, st := s.ok(t, "process_output", map[string]any{"pid": pid, "wait_seconds": 10})
	if out != "one\n[pid "+fmt.Sprint(pid)+" is running; next_offset=4]\n" || st["running"] != true || st["next_offset"] != 4.0 {
		t.Fatalf("output after waiting: %q %v", out, st)
	}
	out, st = s.ok(t, "process_output", map[string]any{"pid": pid, "offset": 4, "wait_seconds": 10})
	if !strings.HasPrefix(out, "two\n") || st["next_offset"] != 8.0 {
		t.Fatalf("reading on from 4: %q", out)
	}
	next := 8
	// From the start, both streams in the order they came.
	if out, _ = s.ok(t, "process_output", map[string]any{"pid": pid}); !strings.HasPrefix(out, "one\ntwo\n") {
		t.Fatalf("from the start: %q", out)
	}
	if out, _ = s.ok(t, "process_output", map[string]any{"pid": pid, "offset": 1, "max_bytes": 2}); !strings.HasPrefix(out, "ne\n[pid ") ||
		!strings.Contains(out, "5 more bytes to read: next_offset=3]") {
		t.Fatalf("a part: %q", out)
	}
	if out, _ = s.ok(t, "process_list", nil); !strings.Contains(out, "running") || !strings.Contains(out, "[job]") {
		t.Fatalf("process_list: %q", out)
	}
	// Nothing new: the wait ends after wait_seconds with no output.
	out, _ = s.ok(t, "process_output", map[string]any{"pid": pid, "offset": next, "wait_seconds": 1})
	if !strings.HasPrefix(out, "[pid ") || !strings.Contains(out, "is running; next_offset=8]") {
		t.Fatalf("idle poll: %q", out)
	}
	s.ok(t, "process_kill", map[string]any{"pid": pid, "signal": "SIGTERM"})
	out, st = s.ok(t, "process_output", map[string]any{"pid": pid, "offset": next, "wait_seconds": 10})
	if st["running"] != false || !strings.Contains(out, "exited with code 143") {
		t.Fatalf("after SIGTERM: %q", out)
	}
	s.fails(t, "not_found", "process_output", map[string]any{"pid": 999999})
}

func TestSandboxTools(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{})
	_, st := s.ok(t, "sandbox_create", map[string]any{"timeout_seconds": 3600})
	id := st["sandbox_id"].(string)
	if out, _ := s.ok(t, "sandbox_pause", map[string]any{"sandbox_id": id}); !strings.Contains(out, id+": paused") {
		t.Fatalf("pause: %q", out)
	}
	// A resume keeps the time the sandbox had left.
	if out, _ := s.ok(t, "sandbox_resume", map[string]any{"sandbox_id": id}); !strings.Contains(out, id+": running") {
		t.Fatalf("resume: %q", out)
	}
	if sb, err := c.Get(t.Context(), id); err != nil || sb.Deadline == nil || time.Until(*sb.Deadline) < 3500*time.Second {
		t.Fatalf("deadline after resume: %+v %v", sb, err)
	}
	s.fails(t, "failed_precondition", "sandbox_resume", map[string]any{"sandbox_id": id})
	s.ok(t, "sandbox_pause", map[string]any{"sandbox_id": id})
	s.ok(t, "sandbox_resume", map[string]any{"sandbox_id": id, "timeout_seconds": 60})
	if sb, err := c.Get(t.Context(), id); err != nil || sb.Deadline == nil || time.Until(*sb.Deadline) > 60*time.Second {
		t.Fatalf("deadline after resume for 60 s: %+v %v", sb, err)
	}
	// The session's own sandbox comes back from a pause by itself, still
	// without a deadline.
	_, st = s.ok(t, "exec", map[string]any{"command": "true"})
	own := st["sandbox_id"].(string)
	s.ok(t, "sandbox_pause", map[string]any{"sandbox_id": own})
	s.ok(t, "exec", map[string]any{"command": "true"})
	if sb, err := c.Get(t.Context(), own); err != nil || sb.State != "running" || sb.Deadline != nil {
		t.Fatalf("session sandbox after a pause: %+v %v", sb, err)
	}
	out, _ := s.ok(t, "port_url", map[string]any{"sandbox_id": id, "port": 8080})
	if !strings.Contains(out, "/v1/sandboxes/"+id+"/ports/8080/") {
		t.Fatalf("port_url: %q", out)
	}
	s.fails(t, "invalid_argument", "port_url", map[string]any{"port": 70000})
	s.ok(t, "sandbox_kill", map[string]any{"sandbox_id": id})
	if _, err := c.Get(t.Context(), id); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("after sandbox_kill: %v", err)
	}
}

func TestResources(t *testing.T) {
	s := connect(t, api(t), Policy{})
	_, st := s.ok(t, "exec", map[string]any{"command": "true"})
	id := st["sandbox_id"].(string)
	res, err := s.ListResources(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range res.Resources {
		uris = append(uris, r.URI)
	}
	if !slices.Contains(uris, "corral://sandboxes") || !slices.Contains(uris, "corral://sandboxes/"+id) {
		t.Fatalf("resources %v", uris)
	}
	rr, err := s.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "corral://sandboxes/" + id})
	if err != nil {
		t.Fatal(err)
	}
	var sb map[string]any
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &sb); err != nil || sb["state"] != "running" || sb["session"] != true {
		t.Fatalf("resource %s: %v", rr.Contents[0].Text, err)
	}
	if _, err := s.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "corral://sandboxes/sb-nope"}); err == nil {
		t.Fatal("reading an unknown sandbox succeeded")
	}
}

func TestClipWriter(t *testing.T) {
	for _, tt := range []struct {
		name   string
		writes []string
		limit  int
		want   string
	}{
		{"short", []string{"abc"}, 10, "abc"},
		{"exact", []string{"0123456789"}, 10, "0123456789"},
		{"long", []string{"0123456789abcdef"}, 10, "01234\n[... 6 bytes left out ...]\nbcdef"},
		{"many writes", []string{"012", "345", "678", "9ab", "cde", "f"}, 10, "01234\n[... 6 bytes left out ...]\nbcdef"},
		{"odd limit", []string{"0123456789"}, 5, "01\n[... 5 bytes left out ...]\n789"},
		{"bad utf-8", []string{"a\xffb"}, 10, "a\uFFFDb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newClipWriter(tt.limit)
			for _, s := range tt.writes {
				w.Write([]byte(s))
			}
			if got := w.String(); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// TestMain checks that sessions leave no goroutine behind: each session's
// watcher, and the streams of polls that stopped at their first output.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCloseEndsSessions checks that Close, as the daemon calls it when it
// stops, cancels a call in flight rather than waiting for it, and deletes
// the session's sandbox.
func TestCloseEndsSessions(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{})
	_, st := s.ok(t, "exec", map[string]any{"command": "true"})
	id := st["sandbox_id"].(string)
	called := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "sleep 600"}})
		called <- res
	}()
	// Close once the command runs.
	for ps, _ := c.Processes(t.Context(), id); len(ps) == 0; ps, _ = c.Processes(t.Context(), id) {
		time.Sleep(10 * time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { s.srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close waited for the call in flight")
	}
	if _, err := c.Get(t.Context(), id); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("session sandbox after Close: %v", err)
	}
	if res := <-called; res != nil && !res.IsError {
		t.Fatalf("the cancelled call succeeded: %s", text(res))
	}
}

func TestExplicitAddressRules(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ceiling corral.NetworkPolicy
		ask     []string
		allowed bool
	}{
		{"metadata address under 0/0", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"0.0.0.0/0"}}, []string{"169.254.169.254"}, false},
		{"private range under 0/0", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"0.0.0.0/0"}}, []string{"10.0.0.0/8"}, false},
		{"public range under 0/0", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"0.0.0.0/0"}}, []string{"198.51.100.0/24"}, true},
		{"one address under 0/0", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"0.0.0.0/0"}}, []string{"198.51.100.7"}, false},
		{"private range under open", corral.NetworkPolicy{Mode: "open"}, []string{"10.0.0.0/8"}, false},
		{"public range under open", corral.NetworkPolicy{Mode: "open"}, []string{"198.51.100.0/24"}, true},
		{"private range under its own", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"10.1.0.0/16"}}, []string{"10.1.2.0/24"}, true},
		{"one address in a named range", corral.NetworkPolicy{Mode: "allowlist", AllowCIDRs: []string{"10.1.0.0/16"}}, []string{"10.1.2.3"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{cfg: Config{Policy: Policy{Network: tt.ceiling}}}
			_, err := s.network(NetworkIn{AllowCIDRs: tt.ask})
			if (err == nil) != tt.allowed {
				t.Fatalf("asking for %v under %+v: %v, want allowed %v", tt.ask, tt.ceiling, err, tt.allowed)
			}
		})
	}
}

// TestRunDeletesBeforeReturning checks that Run returns only once the
// session sandbox is gone: `corral mcp` exits right after.
func TestRunDeletesBeforeReturning(t *testing.T) {
	c := api(t)
	for range 5 {
		srv := New(Config{Client: func(http.Header) (*corral.Client, error) { return c, nil }, Policy: Policy{Template: "bb"},
			Logger: slog.New(slog.DiscardHandler)})
		st, ct := mcp.NewInMemoryTransports()
		done := make(chan error, 1)
		go func() { done <- srv.Run(context.Background(), st) }()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "true"}})
		if err != nil || res.IsError {
			t.Fatal(err, res)
		}
		id := structured(t, res)["sandbox_id"].(string)
		cs.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(t.Context(), id); corral.ErrorCode(err) != corral.CodeNotFound {
			t.Fatalf("the session sandbox when Run returned: %v", err)
		}
		srv.Close()
	}
}

func TestMaxSandboxesUnderConcurrentCreates(t *testing.T) {
	s := connect(t, api(t), Policy{MaxSandboxes: 2})
	results := make(chan *mcp.CallToolResult, 6)
	for range cap(results) {
		go func() {
			res, _ := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
			results <- res
		}()
	}
	created := 0
	for range cap(results) {
		if res := <-results; res != nil && !res.IsError {
			created++
		}
	}
	if created != 2 {
		t.Fatalf("%d sandboxes created at once with MaxSandboxes 2", created)
	}
}

// TestFilesReadEdges reads through a symbolic link, in parts shorter than
// a character, and from a process in parts that cut characters.
func TestFilesReadEdges(t *testing.T) {
	c, roots := apiRoots(t)
	s := connect(t, c, Policy{})
	_, st := s.ok(t, "files_write", map[string]any{"path": "/big.txt", "content": strings.Repeat("x", 30000)})
	id := st["sandbox_id"].(string)
	if err := os.Symlink("big.txt", filepath.Join(roots, id, "link.txt")); err != nil {
		t.Fatal(err)
	}
	out, st := s.ok(t, "files_read", map[string]any{"path": "/link.txt"})
	if !strings.HasSuffix(out, "[bytes 0 to 20000 of 30000; read on with offset=20000]\n") || st["size"] != 30000.0 {
		t.Fatalf("through a link: %q", out[len(out)-60:])
	}
	// A part shorter than a character still moves on.
	s.ok(t, "files_write", map[string]any{"path": "/e.txt", "content": "éé"})
	if _, st = s.ok(t, "files_read", map[string]any{"path": "/e.txt", "length": 1}); st["end"] != 1.0 {
		t.Fatalf("one byte of a character: %v", st)
	}

	_, st = s.ok(t, "process_start", map[string]any{"command": "printf 'a\\303\\251b'; sleep 30"})
	pid := st["pid"]
	_, first := s.ok(t, "process_output", map[string]any{"pid": pid, "max_bytes": 2, "wait_seconds": 10})
	for first["output_bytes"] != 4.0 {
		_, first = s.ok(t, "process_output", map[string]any{"pid": pid, "max_bytes": 2})
	}
	_, second := s.ok(t, "process_output", map[string]any{"pid": pid, "offset": first["next_offset"], "max_bytes": 3})
	if first["output"] != "a" || first["next_offset"] != 1.0 || second["output"] != "éb" {
		t.Fatalf("output in parts: %v then %v", first, second)
	}
}

// TestSessionSandboxUnderMaxTimeout checks that a daemon that refuses
// sandboxes without a deadline still gives the session a sandbox, whose
// deadline is renewed while it is used.
func TestSessionSandboxUnderMaxTimeout(t *testing.T) {
	c, _ := apiRoots(t, func(cfg *sandbox.Config) { cfg.MaxTimeout, cfg.DefaultTimeout = time.Hour, 10*time.Second })
	s := connect(t, c, Policy{})
	_, st := s.ok(t, "exec", map[string]any{"command": "true"})
	id := st["sandbox_id"].(string)
	if _, err := c.SetTimeout(t.Context(), id, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	s.ok(t, "exec", map[string]any{"command": "true"})
	if sb, err := c.Get(t.Context(), id); err != nil || sb.Deadline == nil || time.Until(*sb.Deadline) < 5*time.Second {
		t.Fatalf("deadline not renewed: %+v %v", sb, err)
	}
}

// TestReplacedSessionSandboxIsSaid checks that a call that had to make a
// new session sandbox says so.
func TestReplacedSessionSandboxIsSaid(t *testing.T) {
	c := api(t)
	s := connect(t, c, Policy{})
	_, st := s.ok(t, "exec", map[string]any{"command": "true"})
	if err := c.Delete(t.Context(), st["sandbox_id"].(string)); err != nil {
		t.Fatal(err)
	}
	out, _ := s.ok(t, "exec", map[string]any{"command": "true"})
	if !strings.HasPrefix(out, "note: this session's sandbox was gone") {
		t.Fatalf("after a replacement: %q", out)
	}
	if out, _ = s.ok(t, "exec", map[string]any{"command": "true"}); strings.HasPrefix(out, "note:") {
		t.Fatalf("the note came twice: %q", out)
	}
}

// TestHTTPSessions drives the streamable HTTP handler: a session's
// sandbox is deleted when its idle time is up, and Close ends sessions
// that made no tool call, so that the HTTP server can shut down.
func TestHTTPSessions(t *testing.T) {
	c := api(t)
	srv := New(Config{Client: func(http.Header) (*corral.Client, error) { return c, nil }, Policy: Policy{Template: "bb"},
		Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.HTTPHandler(time.Second))
	connectHTTP := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	cs := connectHTTP()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "port_url", Arguments: map[string]any{"port": 8080}})
	if err != nil || res.IsError {
		t.Fatal(err, res)
	}
	if u := structured(t, res)["url"].(string); !strings.HasPrefix(u, hs.URL+"/v1/sandboxes/") {
		t.Fatalf("port_url over HTTP: %s, want one on %s", u, hs.URL)
	}
	id := structured(t, res)["sandbox_id"].(string)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err := c.Get(t.Context(), id); corral.ErrorCode(err) == corral.CodeNotFound {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal("an idle HTTP session kept its sandbox")
		}
	}
	cs.Close()

	idle := connectHTTP()
	if _, err := idle.ListTools(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := hs.Config.Shutdown(ctx); err != nil {
		t.Fatalf("shutting down with a session that made no call: %v", err)
	}
	hs.Close()
	idle.Close()
}
