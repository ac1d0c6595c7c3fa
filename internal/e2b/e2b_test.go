package e2b

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "test-key"

// env is a facade over a Manager with the fake driver (processes run on
// the host, files under the sandbox's root copy) and one sandbox.
type env struct {
	t     testing.TB
	ts    *httptest.Server
	srv   *Server
	m     *sandbox.Manager
	id    string // a running sandbox
	token string // its access token
}

// newEnv makes an env; opts change the Manager's and the facade's
// configuration before they are made.
func newEnv(t testing.TB, opts ...func(*sandbox.Config, *Config)) *env {
	t.Helper()
	sock, err := os.MkdirTemp("", "e2b-")
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
	mcfg := sandbox.Config{Store: st, Storage: storagefake.New(t.TempDir()), Drivers: []driver.Driver{drv},
		Defaults: sandbox.Limits{MilliCPUs: 500, MemoryBytes: 128 << 20, Pids: 64}, SnapshotDir: filepath.Join(t.TempDir(), "snapshots"),
		Mounter: bindMounter{}}
	cfg := Config{APIKey: testKey}
	for _, o := range opts {
		o(&mcfg, &cfg)
	}
	m, err := sandbox.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateTemplate(t.Context(), "bb", "import", func(dir string) error {
		return os.MkdirAll(filepath.Join(dir, "root"), 0o755)
	}); err != nil {
		t.Fatal(err)
	}
	cfg.Manager = m
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
		for _, sb := range m.List(context.Background(), sandbox.Filter{}) {
			_ = m.Delete(context.Background(), sb.ID)
		}
		m.Close()
		st.Close()
	})
	e := &env{t: t, ts: ts, srv: srv, m: m}
	var created map[string]any
	if code := e.api("POST", "/v2/sandboxes", `{"templateID":"bb","timeout":300,"metadata":{"team":"a"},"envVars":{"GREETING":"hi"}}`, &created); code != 201 {
		t.Fatalf("create: %d %v", code, created)
	}
	e.id, e.token = created["sandboxID"].(string), created["envdAccessToken"].(string)
	return e
}

// api calls the control plane with the API key and decodes the answer.
func (e *env) api(method, path, body string, out any) int {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.ts.URL+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// envd makes an envd request for the env's sandbox.
func (e *env) envd(method, path, contentType string, body io.Reader, hdr map[string]string) *http.Response {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.ts.URL+path, body)
	req.Header.Set("E2b-Sandbox-Id", e.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", e.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// unary makes a unary Connect call with JSON.
func (e *env) unary(method, body string) (int, map[string]any) {
	e.t.Helper()
	resp := e.envd("POST", "/"+method, "application/json", strings.NewReader(body), nil)
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// streamJSON makes a server-streaming Connect call with JSON and returns
// its messages and its end-of-stream message.
func (e *env) streamJSON(method, body string, hdr map[string]string) ([]map[string]any, map[string]any) {
	e.t.Helper()
	var msgs []map[string]any
	end := e.streamRaw(method, "application/connect+json", []byte(body), hdr, func(data []byte) bool {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			e.t.Fatalf("message %q: %v", data, err)
		}
		msgs = append(msgs, m)
		return true
	})
	return msgs, end
}

// streamRaw sends one enveloped request message and calls each for every
// response message until it returns false or the stream ends.
func (e *env) streamRaw(method, ct string, body []byte, hdr map[string]string, each func([]byte) bool) map[string]any {
	e.t.Helper()
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	resp := e.envd("POST", "/"+method, ct, bytes.NewReader(append(env, body...)), hdr)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("%s: HTTP %d: %s", method, resp.StatusCode, b)
	}
	if got := resp.Header.Get("Content-Type"); got != ct {
		e.t.Fatalf("%s: content type %q, want %q", method, got, ct)
	}
	r := bufio.NewReader(resp.Body)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			e.t.Fatalf("%s: stream ended without end-of-stream message: %v", method, err)
		}
		data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(r, data); err != nil {
			e.t.Fatal(err)
		}
		if hdr[0]&0x02 != 0 { // the end-of-stream flag
			var end map[string]any
			if err := json.Unmarshal(data, &end); err != nil {
				e.t.Fatalf("end message %q: %v", data, err)
			}
			return end
		}
		if !each(data) {
			return nil
		}
	}
}

func TestControlPlane(t *testing.T) {
	e := newEnv(t)
	var out map[string]any
	if code := e.api("POST", "/sandboxes", `{"templateID":"nope"}`, &out); code != 404 || out["code"] != 404.0 || !strings.Contains(out["message"].(string), `template "nope" not found`) {
		t.Errorf("unknown template: %d %v", code, out)
	}
	// This daemon has no network support: asking for the internet is
	// refused clearly, not ignored.
	out = nil
	if code := e.api("POST", "/sandboxes", `{"templateID":"bb","allow_internet_access":true}`, &out); code != 409 || !strings.Contains(out["message"].(string), "without network support") {
		t.Errorf("internet access: %d %v", code, out)
	}
	out = nil
	if code := e.api("POST", "/sandboxes", `{"templateID":"bb","network":{"denyOut":["10.0.0.0/8"]}}`, &out); code != 400 || !strings.Contains(out["message"].(string), "denyOut") {
		t.Errorf("denyOut of one range: %d %v", code, out)
	}
	out = nil
	if code := e.api("POST", "/sandboxes", `{"templateID":"bb","autoResume":{"enabled":true}}`, &out); code != 400 || !strings.Contains(out["message"].(string), "autoResume") {
		t.Errorf("autoResume: %d %v", code, out)
	}
	// autoPause is the pause action at the deadline.
	out = nil
	if code := e.api("POST", "/sandboxes", `{"templateID":"bb","autoPause":true}`, &out); code != 201 {
		t.Fatalf("autoPause: %d %v", code, out)
	}
	paused := out["sandboxID"].(string)
	if sb, err := e.m.Get(context.Background(), paused); err != nil || sb.OnDeadline != sandbox.ActionPause {
		t.Errorf("autoPause sandbox: %+v %v", sb, err)
	}
	if err := e.m.Delete(t.Context(), paused); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", e.ts.URL+"/v2/sandboxes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("no API key: %d", resp.StatusCode)
	}

	var got map[string]any
	if code := e.api("GET", "/sandboxes/"+e.id, "", &got); code != 200 {
		t.Fatalf("get: %d %v", code, got)
	}
	if got["templateID"] != "bb" || got["state"] != "running" || got["envdAccessToken"] != e.token || got["memoryMB"] != 128.0 ||
		got["cpuCount"] != 1.0 || got["metadata"].(map[string]any)["team"] != "a" || got["envdVersion"] != envdVersion {
		t.Errorf("get: %v", got)
	}
	var list []map[string]any
	if code := e.api("GET", "/v2/sandboxes?state=running,paused&metadata=team%3Da", "", &list); code != 200 || len(list) != 1 || list[0]["sandboxID"] != e.id {
		t.Errorf("list: %d %v", code, list)
	}
	if code := e.api("GET", "/v2/sandboxes?metadata=team%3Db", "", &list); code != 200 || len(list) != 0 {
		t.Errorf("list other team: %d %v", code, list)
	}
	if code := e.api("GET", "/v2/sandboxes?state=bogus", "", &out); code != 400 {
		t.Errorf("bad state: %d %v", code, out)
	}

	before, _ := e.m.Get(context.Background(), e.id)
	if code := e.api("POST", "/sandboxes/"+e.id+"/timeout", `{"timeout":3600}`, nil); code != 204 {
		t.Errorf("timeout: %d", code)
	}
	after, _ := e.m.Get(context.Background(), e.id)
	if !after.Deadline.After(before.Deadline.Add(50 * time.Minute)) {
		t.Errorf("deadline %v -> %v", before.Deadline, after.Deadline)
	}
	// connect extends only: a shorter timeout leaves the deadline.
	if code := e.api("POST", "/v2/sandboxes/"+e.id+"/connect", `{"timeout":10}`, &out); code != 200 || out["envdAccessToken"] != e.token {
		t.Errorf("connect: %d %v", code, out)
	}
	if again, _ := e.m.Get(context.Background(), e.id); !again.Deadline.Equal(after.Deadline) {
		t.Errorf("connect shortened the deadline: %v -> %v", after.Deadline, again.Deadline)
	}
	if code := e.api("POST", "/sandboxes/"+e.id+"/pause", `{}`, nil); code != 204 {
		t.Errorf("pause: %d", code)
	}
	if sb, _ := e.m.Get(context.Background(), e.id); sb.State != sandbox.StatePaused {
		t.Errorf("after pause the sandbox is %s", sb.State)
	}
	if code := e.api("POST", "/sandboxes/"+e.id+"/pause", `{}`, &out); code != 409 {
		t.Errorf("pause of a paused sandbox: %d %v", code, out)
	}
	if code := e.api("POST", "/v2/sandboxes/"+e.id+"/connect", `{"timeout":600}`, &out); code != 201 {
		t.Errorf("connect to a paused sandbox: %d %v", code, out)
	}
	if sb, _ := e.m.Get(context.Background(), e.id); sb.State != sandbox.StateRunning || sb.Deadline.Before(time.Now().Add(9*time.Minute)) {
		t.Errorf("after connect the sandbox is %s with deadline %v", sb.State, sb.Deadline)
	}
	var metrics []map[string]any
	if code := e.api("GET", "/sandboxes/"+e.id+"/metrics", "", &metrics); code != 200 || len(metrics) != 1 || metrics[0]["memTotal"] != float64(128<<20) {
		t.Errorf("metrics: %d %v", code, metrics)
	}
	if code := e.api("DELETE", "/sandboxes/"+e.id, "", nil); code != 204 {
		t.Errorf("kill: %d", code)
	}
	if code := e.api("DELETE", "/sandboxes/"+e.id, "", &out); code != 404 || out["code"] != 404.0 {
		t.Errorf("kill again: %d %v", code, out)
	}
	// envd of a killed sandbox: 502, which the SDK reads as "killed".
	if resp := e.envd("GET", "/health", "", nil, nil); resp.StatusCode != 502 {
		t.Errorf("health of killed sandbox: %d", resp.StatusCode)
	}
}

func TestEnvdAuth(t *testing.T) {
	e := newEnv(t)
	e.token = "wrong"
	if code, out := e.unary("process.Process/List", `{}`); code != 401 || out["code"] != "unauthenticated" {
		t.Errorf("wrong token: %d %v", code, out)
	}
}

func TestProcessStartJSON(t *testing.T) {
	e := newEnv(t)
	req := `{"process":{"cmd":"/bin/bash","args":["-l","-c","echo $GREETING $X; echo oops >&2; exit 3"],"envs":{"X":"there"}},"stdin":false}`
	msgs, end := e.streamJSON("process.Process/Start", req, nil)
	if end["error"] != nil {
		t.Fatalf("stream error: %v", end)
	}
	if len(msgs) < 3 {
		t.Fatalf("messages: %v", msgs)
	}
	if pid := msgs[0]["event"].(map[string]any)["start"].(map[string]any)["pid"]; pid == nil {
		t.Fatalf("first message is not start: %v", msgs[0])
	}
	var stdout, stderr string
	for _, m := range msgs[1 : len(msgs)-1] {
		d := m["event"].(map[string]any)["data"].(map[string]any)
		if v, ok := d["stdout"].(string); ok {
			stdout += string(decodeB64(t, v))
		}
		if v, ok := d["stderr"].(string); ok {
			stderr += string(decodeB64(t, v))
		}
	}
	if stdout != "hi there\n" || stderr != "oops\n" {
		t.Errorf("stdout %q stderr %q", stdout, stderr)
	}
	wantEnd := map[string]any{"exitCode": 3.0, "exited": true, "status": "exit status 3", "error": "exit status 3"}
	if diff := cmp.Diff(wantEnd, msgs[len(msgs)-1]["event"].(map[string]any)["end"]); diff != "" {
		t.Errorf("end event (-want +got):\n%s", diff)
	}
}

func TestProcessStartProtoAndConnect(t *testing.T) {
	e := newEnv(t)
	req, err := proto.Marshal(&envdpb.StartRequest{
		Process: &envdpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo one; sleep 0.3; echo two"}},
		Tag:     proto.String("t1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var pid uint64
	var out []string
	var exited bool
	end := e.streamRaw("process.Process/Start", "application/connect+proto", req, nil, func(data []byte) bool {
		var resp envdpb.StartResponse
		if err := proto.Unmarshal(data, &resp); err != nil {
			t.Fatal(err)
		}
		switch ev := resp.GetEvent(); {
		case ev.GetStart() != nil:
			pid = uint64(ev.GetStart().GetPid())
		case ev.GetData() != nil:
			out = append(out, string(ev.GetData().GetStdout()))
		case ev.GetEnd() != nil:
			exited = ev.GetEnd().GetExited()
		}
		return true
	})
	if end["error"] != nil || pid == 0 || strings.Join(out, "") != "one\ntwo\n" || !exited {
		t.Fatalf("proto start: end %v pid %d out %q exited %v", end, pid, out, exited)
	}
	// Connect replays the buffered output of the ended process.
	msgs, end := e.streamJSON("process.Process/Connect", `{"process":{"pid":`+itoaU(pid)+`}}`, nil)
	if end["error"] != nil || len(msgs) < 3 {
		t.Fatalf("connect: %v %v", msgs, end)
	}
	if _, ok := msgs[len(msgs)-1]["event"].(map[string]any)["end"]; !ok {
		t.Errorf("connect did not end with the end event: %v", msgs)
	}
}

// TestUnaryProto sends unary calls in the binary encoding, written here
// byte by byte, and malformed messages that must be refused.
func TestUnaryProto(t *testing.T) {
	e := newEnv(t)
	call := func(method, wireHex string) (*http.Response, []byte) {
		t.Helper()
		resp := e.envd("POST", "/"+method, "application/proto", bytes.NewReader(unhex(t, wireHex)), nil)
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	// MakeDirRequest{path: "/work/p"}
	resp, body := call("filesystem.Filesystem/MakeDir", "0a 07 2f776f726b2f70")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/proto" {
		t.Fatalf("MakeDir: HTTP %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var made envdpb.MakeDirResponse
	if err := proto.Unmarshal(body, &made); err != nil || made.GetEntry().GetType() != envdpb.FileType_FILE_TYPE_DIRECTORY ||
		made.GetEntry().GetPath() != "/work/p" || made.GetEntry().GetName() != "p" {
		t.Errorf("MakeDir answer: %+v %v", &made, err)
	}
	// ListDirRequest{path: "/work", depth: 1}, with an unknown field 9 first.
	resp, body = call("filesystem.Filesystem/ListDir", "48 07 0a 05 2f776f726b 10 01")
	var list envdpb.ListDirResponse
	if err := proto.Unmarshal(body, &list); resp.StatusCode != 200 || err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetName() != "p" {
		t.Errorf("ListDir: HTTP %d %+v %v", resp.StatusCode, &list, err)
	}
	for _, tt := range []struct{ name, method, wire, msg string }{
		{"truncated path", "filesystem.Filesystem/Stat", "0a 07 2f", "field 1: unexpected EOF"},
		{"overlong varint in an unknown field", "filesystem.Filesystem/Stat", "48 ffffffffffffffffffff01", "field 9: proto: variable length integer overflow"},
		{"truncated pid", "process.Process/SendSignal", "0a 02 08 ff", "field 1: field 1: unexpected EOF"},
	} {
		resp, body := call(tt.method, tt.wire)
		var ce struct{ Code, Message string }
		_ = json.Unmarshal(body, &ce)
		// protobuf's own messages put a no-break space after "proto:" at random.
		msg := strings.ReplaceAll(ce.Message, "\u00a0", " ")
		if resp.StatusCode != 400 || ce.Code != "invalid_argument" || !strings.Contains(msg, "invalid protobuf message: "+tt.msg) {
			t.Errorf("%s: HTTP %d %s", tt.name, resp.StatusCode, body)
		}
	}
}

func TestBackgroundProcessConnectAndKill(t *testing.T) {
	e := newEnv(t)
	var pid float64
	e.streamRaw("process.Process/Start", "application/connect+json",
		[]byte(`{"process":{"cmd":"/bin/sh","args":["-c","echo ready; sleep 30"]},"stdin":true}`), nil, func(data []byte) bool {
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			pid = m["event"].(map[string]any)["start"].(map[string]any)["pid"].(float64)
			return false // leave the stream: the process runs on
		})
	code, list := e.unary("process.Process/List", `{}`)
	if code != 200 || !strings.Contains(toJSON(list), `"pid":`+itoaU(uint64(pid))) {
		t.Fatalf("list: %d %v", code, list)
	}
	p := `{"process":{"pid":` + itoaU(uint64(pid)) + `}}`
	if code, out := e.unary("process.Process/SendInput", `{"process":{"pid":`+itoaU(uint64(pid))+`},"input":{"stdin":"aGkK"}}`); code != 200 {
		t.Errorf("send input: %d %v", code, out)
	}
	if code, out := e.unary("process.Process/SendSignal", `{"process":{"pid":`+itoaU(uint64(pid))+`},"signal":"SIGNAL_SIGKILL"}`); code != 200 {
		t.Errorf("kill: %d %v", code, out)
	}
	msgs, end := e.streamJSON("process.Process/Connect", p, nil)
	if end["error"] != nil || len(msgs) < 2 {
		t.Fatalf("connect after kill: %v %v", msgs, end)
	}
	wantEnd := map[string]any{"exitCode": -1.0, "status": "signal: killed", "error": "signal: killed"}
	if diff := cmp.Diff(wantEnd, msgs[len(msgs)-1]["event"].(map[string]any)["end"]); diff != "" {
		t.Errorf("end event (-want +got):\n%s", diff)
	}
	if code, out := e.unary("process.Process/SendSignal", p+``); code != 400 {
		t.Errorf("unspecified signal: %d %v", code, out)
	}
	if code, out := e.unary("process.Process/SendSignal", `{"process":{"pid":999999},"signal":9}`); code != 404 || out["code"] != "not_found" {
		t.Errorf("kill unknown: %d %v", code, out)
	}
}

func TestProcessTimeoutAndKeepalive(t *testing.T) {
	e := newEnv(t)
	msgs, end := e.streamJSON("process.Process/Start", `{"process":{"cmd":"/bin/sh","args":["-c","sleep 3"]}}`,
		map[string]string{"Connect-Timeout-Ms": "1500", "Keepalive-Ping-Interval": "1"})
	keepalives := 0
	for _, m := range msgs {
		if _, ok := m["event"].(map[string]any)["keepalive"]; ok {
			keepalives++
		}
	}
	if keepalives == 0 {
		t.Errorf("no keepalive in %v", msgs)
	}
	if end["error"] == nil && !strings.Contains(toJSON(msgs), "signal: killed") {
		t.Errorf("a process past its timeout was neither killed nor cut short: %v %v", msgs, end)
	}
}

func TestFilesystem(t *testing.T) {
	e := newEnv(t)
	if code, out := e.unary("filesystem.Filesystem/MakeDir", `{"path":"/work/a/b"}`); code != 200 || out["entry"].(map[string]any)["type"] != "FILE_TYPE_DIRECTORY" {
		t.Fatalf("makeDir: %d %v", code, out)
	}
	if code, out := e.unary("filesystem.Filesystem/MakeDir", `{"path":"/work/a/b"}`); code != 409 || out["code"] != "already_exists" {
		t.Errorf("makeDir again: %d %v", code, out)
	}
	// Multipart upload of two files named by their parts.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for name, data := range map[string]string{"/work/a/one.txt": "one", "rel.txt": "relative"} {
		fw, _ := mw.CreateFormFile("file", name)
		fw.Write([]byte(data))
	}
	mw.Close()
	resp := e.envd("POST", "/files", mw.FormDataContentType(), &body, nil)
	var entries []map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&entries)
	if resp.StatusCode != 200 || len(entries) != 2 {
		t.Fatalf("upload: %d %v", resp.StatusCode, entries)
	}
	// A raw gzip upload.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()
	if resp := e.envd("POST", "/files?path=/work/z.txt", "application/octet-stream", &gz, map[string]string{"Content-Encoding": "gzip"}); resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("raw upload: %d %s", resp.StatusCode, b)
	}
	for p, want := range map[string]string{"/work/a/one.txt": "one", "~/rel.txt": "relative", "/root/rel.txt": "relative", "/work/z.txt": "zipped"} {
		resp := e.envd("GET", "/files?path="+p, "", nil, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != want {
			t.Errorf("download %s: %d %q", p, resp.StatusCode, b)
		}
	}
	resp = e.envd("GET", "/files?path=/nope", "", nil, nil)
	var apiErr map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&apiErr)
	if resp.StatusCode != 404 || apiErr["code"] != 404.0 {
		t.Errorf("download missing: %d %v", resp.StatusCode, apiErr)
	}
	code, out := e.unary("filesystem.Filesystem/ListDir", `{"path":"/work","depth":2}`)
	if code != 200 {
		t.Fatalf("listDir: %d %v", code, out)
	}
	var names []string
	for _, en := range out["entries"].([]any) {
		names = append(names, en.(map[string]any)["path"].(string))
	}
	if diff := cmp.Diff([]string{"/work/a", "/work/a/b", "/work/a/one.txt", "/work/z.txt"}, names); diff != "" {
		t.Errorf("listDir (-want +got):\n%s", diff)
	}
	if code, out := e.unary("filesystem.Filesystem/Stat", `{"path":"/work/a/one.txt"}`); code != 200 || out["entry"].(map[string]any)["size"] != "3" ||
		out["entry"].(map[string]any)["permissions"] != "-rw-r--r--" {
		t.Errorf("stat: %d %v", code, out)
	}
	if code, out := e.unary("filesystem.Filesystem/Stat", `{"path":"/work/none"}`); code != 404 || out["code"] != "not_found" {
		t.Errorf("stat missing: %d %v", code, out)
	}
	if code, out := e.unary("filesystem.Filesystem/Move", `{"source":"/work/z.txt","destination":"/work/y.txt"}`); code != 200 || out["entry"].(map[string]any)["name"] != "y.txt" {
		t.Errorf("move: %d %v", code, out)
	}
	for range 2 { // removing what is gone is no error
		if code, out := e.unary("filesystem.Filesystem/Remove", `{"path":"/work/a"}`); code != 200 {
			t.Errorf("remove: %d %v", code, out)
		}
	}
	if code, out := e.unary("filesystem.Filesystem/Nope", `{}`); code != 501 || out["code"] != "unimplemented" {
		t.Errorf("unknown method: %d %v", code, out)
	}
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	if code, out := e.unary("filesystem.Filesystem/MakeDir", `{"path":"/w"}`); code != 200 {
		t.Fatalf("makeDir: %d %v", code, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan string, 16)
	go func() {
		defer close(got)
		env := make([]byte, 5)
		body := []byte(`{"path":"/w","recursive":true,"include_entry":true}`)
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		req, _ := http.NewRequestWithContext(ctx, "POST", e.ts.URL+"/filesystem.Filesystem/WatchDir", bytes.NewReader(append(env, body...)))
		req.Header.Set("Content-Type", "application/connect+json")
		req.Header.Set("E2b-Sandbox-Id", e.id)
		req.Header.Set("X-Access-Token", e.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		for {
			var hdr [5]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
			if _, err := io.ReadFull(r, data); err != nil {
				return
			}
			got <- string(data)
		}
	}()
	if first := <-got; first != `{"start":{}}` {
		t.Fatalf("first watch message %q", first)
	}
	// Created through the facade, like the SDK would.
	if resp := e.envd("POST", "/files?path=/w/new.txt", "application/octet-stream", strings.NewReader("x"), nil); resp.StatusCode != 200 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	for ev := range got {
		if strings.Contains(ev, `"name":"new.txt"`) && strings.Contains(ev, "EVENT_TYPE_CREATE") {
			cancel()
			for range got {
			}
			return
		}
	}
	t.Fatal("no create event for new.txt")
}

func TestPollingWatcher(t *testing.T) {
	e := newEnv(t)
	e.unary("filesystem.Filesystem/MakeDir", `{"path":"/p"}`)
	code, out := e.unary("filesystem.Filesystem/CreateWatcher", `{"path":"/p"}`)
	if code != 200 {
		t.Fatalf("create watcher: %d %v", code, out)
	}
	id := out["watcherId"].(string)
	e.envd("POST", "/files?path=/p/f", "application/octet-stream", strings.NewReader("x"), nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, out := e.unary("filesystem.Filesystem/GetWatcherEvents", `{"watcher_id":"`+id+`"}`)
		if code != 200 {
			t.Fatalf("events: %d %v", code, out)
		}
		if strings.Contains(toJSON(out), `"name":"f"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no event for f")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, out := e.unary("filesystem.Filesystem/RemoveWatcher", `{"watcherId":"`+id+`"}`); code != 200 {
		t.Errorf("remove watcher: %d %v", code, out)
	}
	if code, _ := e.unary("filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"`+id+`"}`); code != 404 {
		t.Errorf("events of removed watcher: %d", code)
	}
}

func TestSignedDownload(t *testing.T) {
	e := newEnv(t)
	e.envd("POST", "/files?path=/s.txt", "application/octet-stream", strings.NewReader("signed"), nil)
	// What the SDK's downloadUrl computes.
	sum := sha256Sum("/s.txt:read::" + e.token)
	for sig, want := range map[string]int{"v1_" + sum: 200, "v1_bad": 401} {
		req, _ := http.NewRequest("GET", e.ts.URL+"/files?path=/s.txt&signature="+url.QueryEscape(sig), nil)
		req.Header.Set("E2b-Sandbox-Id", e.id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("signature %s: %d, want %d", sig, resp.StatusCode, want)
		}
	}
}

func TestJSONNames(t *testing.T) {
	// Both the JSON name and the proto name of a field are accepted, and
	// map keys are left alone.
	var c jsonCodec
	var w envdpb.WatchDirRequest
	if err := c.Unmarshal([]byte(`{"path":"/x","include_entry":true,"allowNetworkMounts":true}`), &w); err != nil || !w.GetIncludeEntry() || !w.GetAllowNetworkMounts() {
		t.Errorf("watch request: %v %v", &w, err)
	}
	var s envdpb.StartRequest
	if err := c.Unmarshal([]byte(`{"process":{"cmd":"x","envs":{"MY_VAR":"1"}},"pty":{"size":{"cols":"80","rows":24}}}`), &s); err != nil ||
		s.GetProcess().GetEnvs()["MY_VAR"] != "1" || s.GetPty().GetSize().GetCols() != 80 || s.GetPty().GetSize().GetRows() != 24 {
		t.Errorf("start request: %v %v", &s, err)
	}
	var in envdpb.SendInputRequest
	if err := c.Unmarshal([]byte(`{"process":{"pid":7},"input":{"pty":"aGk"}}`), &in); err != nil || string(inputOf(in.GetInput())) != "hi" || in.GetProcess().GetPid() != 7 {
		t.Errorf("send input: %v %v", &in, err)
	}
	var empty envdpb.ListRequest
	if err := c.Unmarshal(nil, &empty); err != nil {
		t.Errorf("empty body: %v", err)
	}
	entry := &envdpb.EntryInfo{Name: "f", Type: envdpb.FileType_FILE_TYPE_FILE, Size: 5, ModifiedTime: timestamppb.New(time.Date(2024, 1, 2, 3, 4, 5, 6000, time.UTC))}
	b, err := c.Marshal(entry)
	var got, want any
	_ = json.Unmarshal(b, &got)
	_ = json.Unmarshal([]byte(`{"name":"f","type":"FILE_TYPE_FILE","size":"5","modifiedTime":"2024-01-02T03:04:05.000006Z"}`), &want)
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Errorf("entry JSON %s %v (-want +got):\n%s", b, err, diff)
	}
}

func decodeB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func itoaU(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func sha256Sum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

func TestCloseEndsStreams(t *testing.T) {
	e := newEnv(t)
	ended := make(chan map[string]any, 1)
	go func() {
		_, end := e.streamJSON("process.Process/Start", `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"]}}`, nil)
		ended <- end
	}()
	time.Sleep(200 * time.Millisecond)
	e.srv.Close()
	select {
	case end := <-ended:
		if code := end["error"].(map[string]any)["code"]; code != "unavailable" {
			t.Errorf("stream ended with %v", end)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the stream")
	}
}

func TestNetworkOptions(t *testing.T) {
	yes, no := true, false
	for _, tt := range []struct {
		name string
		req  newSandbox
		want egress.Policy
		ok   bool
		err  string
	}{
		{name: "nothing: the server's default", req: newSandbox{}},
		{name: "internet", req: newSandbox{AllowInternetAccess: &yes}, want: egress.Policy{Mode: egress.ModeOpen}, ok: true},
		{name: "no internet", req: newSandbox{AllowInternetAccess: &no}, want: egress.Policy{Mode: egress.ModeNone}, ok: true},
		{name: "deny all", req: newSandbox{Network: &networkConfig{DenyOut: []string{"0.0.0.0/0"}}}, want: egress.Policy{Mode: egress.ModeNone}, ok: true},
		{name: "allow list", req: newSandbox{Network: &networkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"1.2.3.4", "10.1.0.0/16", "*.example.test"}}},
			want: egress.Policy{Mode: egress.ModeAllowlist,
				CIDRs:   []egress.CIDRRule{{Prefix: netip.MustParsePrefix("1.2.3.4/32")}, {Prefix: netip.MustParsePrefix("10.1.0.0/16")}},
				Domains: []egress.DomainRule{{Name: "*.example.test"}}}, ok: true},
		{name: "deny one range", req: newSandbox{Network: &networkConfig{DenyOut: []string{"10.0.0.0/8"}}}, err: "denyOut"},
		{name: "allow list with open internet", req: newSandbox{AllowInternetAccess: &yes, Network: &networkConfig{AllowOut: []string{"example.test"}}}, err: "allowOut"},
		{name: "rules on an allow list", req: newSandbox{Network: &networkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"api.openai.test"},
			Rules: map[string][]json.RawMessage{
				"api.openai.test": {json.RawMessage(`{"transform":{"headers":{"Authorization":"Bearer {{secret:openai}}","X-Org":"acme"}}}`)},
				"*.b.test":        {json.RawMessage(`{"transform":{"headers":{"X-A":"1"}}}`), json.RawMessage(`{"transform":{"headers":{}}}`)},
			}}},
			want: egress.Policy{Mode: egress.ModeAllowlist, Domains: []egress.DomainRule{{Name: "api.openai.test"}},
				Headers: []egress.HeaderRule{{Domain: "*.b.test", Name: "X-A", Value: "1"},
					{Domain: "api.openai.test", Name: "Authorization", Value: "Bearer {{secret:openai}}"},
					{Domain: "api.openai.test", Name: "X-Org", Value: "acme"}}}, ok: true},
		// As in E2B, a rule's host is not thereby allowed: the mode is
		// left to the server's default (or the sandbox's, in an update).
		{name: "rules alone", req: newSandbox{Network: &networkConfig{Rules: map[string][]json.RawMessage{
			"api.test": {json.RawMessage(`{"transform":{"headers":{"X-Key":"{{secret:k}}"}}}`)}}}},
			want: egress.Policy{Headers: []egress.HeaderRule{{Domain: "api.test", Name: "X-Key", Value: "{{secret:k}}"}}}, ok: true},
		{name: "rules with open internet", req: newSandbox{AllowInternetAccess: &yes, Network: &networkConfig{Rules: map[string][]json.RawMessage{
			"api.test": {json.RawMessage(`{"transform":{"headers":{"X-Key":"v"}}}`)}}}},
			want: egress.Policy{Mode: egress.ModeOpen, Headers: []egress.HeaderRule{{Domain: "api.test", Name: "X-Key", Value: "v"}}}, ok: true},
		{name: "rule without transform", req: newSandbox{Network: &networkConfig{Rules: map[string][]json.RawMessage{
			"api.test": {json.RawMessage(`{}`)}}}}, err: "network.rules"},
		{name: "rule with another transform", req: newSandbox{Network: &networkConfig{Rules: map[string][]json.RawMessage{
			"api.test": {json.RawMessage(`{"transform":{"headers":{"X":"v"},"headerValueReplacements":{}}}`)}}}}, err: "network.rules"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, ok, err := tt.req.policy()
			if tt.err != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("policy: %v, want invalid argument naming %s", err, tt.err)
				}
				return
			}
			if err != nil || ok != tt.ok {
				t.Fatalf("policy: ok %v, %v", ok, err)
			}
			if diff := cmp.Diff(tt.want, p, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

// The API key is accepted as a bearer token whatever the case of the
// scheme (RFC 9110 §11.1), on the control plane and on envd, and so is
// envd's Basic user.
func TestAuthSchemeCase(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		name, auth string
		want       int
	}{
		{"bearer", "Bearer " + testKey, 200},
		{"lower case", "bearer " + testKey, 200},
		{"upper case", "BEARER " + testKey, 200},
		{"wrong key", "bearer nope", 401},
		{"another scheme", "Basic " + testKey, 401},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", e.ts.URL+"/v2/sandboxes", nil)
			req.Header.Set("Authorization", tt.auth)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("control plane: %d, want %d", resp.StatusCode, tt.want)
			}
			resp = e.envd("GET", "/health", "", nil, map[string]string{"X-Access-Token": "", "Authorization": tt.auth})
			if want := map[int]int{200: 204, 401: 401}[tt.want]; resp.StatusCode != want {
				t.Errorf("envd: %d, want %d", resp.StatusCode, want)
			}
		})
	}
	for _, auth := range []string{"Basic YWxpY2U6", "basic YWxpY2U6", "BASIC YWxpY2U6"} {
		if got := userOf(http.Header{"Authorization": {auth}}); got != "alice" {
			t.Errorf("userOf(%q) = %q, want alice", auth, got)
		}
	}
}

// TestTimeoutsOutOfRange: every timeout of the control plane is checked
// against Corral's range before it becomes a duration, where the largest
// would overflow.
func TestTimeoutsOutOfRange(t *testing.T) {
	e := newEnv(t)
	const huge = "9223372036854775807"
	before, _ := e.m.Get(context.Background(), e.id)
	for _, tt := range []struct{ path, body string }{
		{"/sandboxes", `{"templateID":"bb","timeout":` + huge + `}`},
		{"/sandboxes", `{"templateID":"bb","timeout":-1}`},
		{"/sandboxes/" + e.id + "/timeout", `{"timeout":` + huge + `}`},
		{"/sandboxes/" + e.id + "/timeout", `{"timeout":-1}`},
		{"/v2/sandboxes/" + e.id + "/connect", `{"timeout":` + huge + `}`},
		{"/sandboxes/" + e.id + "/fork", `{"timeout":` + huge + `}`},
	} {
		var out map[string]any
		if code := e.api("POST", tt.path, tt.body, &out); code != 400 || !strings.Contains(fmt.Sprint(out["message"]), "timeout must be from 0 to") {
			t.Errorf("POST %s %s: %d %v; want 400 naming the timeout's range", tt.path, tt.body, code, out)
		}
	}
	if after, _ := e.m.Get(context.Background(), e.id); !after.Deadline.Equal(before.Deadline) {
		t.Errorf("refused timeouts moved the deadline: %v -> %v", before.Deadline, after.Deadline)
	}
	if list := e.m.List(context.Background(), sandbox.Filter{}); len(list) != 1 {
		t.Errorf("%d sandboxes after refused creates and forks, want 1", len(list))
	}
}

// unhex decodes hex with spaces between bytes for readability.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
