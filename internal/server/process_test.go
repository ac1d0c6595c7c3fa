package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// newSandbox starts a test server and creates one sandbox in it. With the
// fake driver its processes run on the host, as the test's user.
func newSandbox(t *testing.T) (*corral.Client, string, string) {
	t.Helper()
	c, ts := newTestServer(t, "")
	sb, err := c.Create(t.Context(), corral.CreateOptions{Template: "bb", Env: map[string]string{"SANDBOX_VAR": "from-sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	return c, sb.ID, ts.URL
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessLifecycle(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{
		Shell: `echo "start $SANDBOX_VAR $OWN"; read line; echo "got $line"; echo oops >&2; exit 4`,
		Env:   map[string]string{"OWN": "mine"}, OpenStdin: true, Tag: "job",
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID <= 0 || !p.Running || !p.Background || p.Tag != "job" {
		t.Fatalf("started %+v", p)
	}
	list, err := c.Processes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, q := range list {
		found = found || q.PID == p.PID
	}
	if !found {
		t.Fatalf("process %d not listed in %+v", p.PID, list)
	}
	if err := c.SendStdin(ctx, id, p.PID, strings.NewReader("hello\n")); err != nil {
		t.Fatal(err)
	}
	done, err := c.Wait(ctx, id, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Running || done.ExitCode == nil || *done.ExitCode != 4 || done.ExitedAt == nil {
		t.Fatalf("waited %+v", done)
	}
	var out, errOut bytes.Buffer
	res, err := c.Output(ctx, id, p.PID, corral.OutputOptions{Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	wantOut := "start from-sandbox mine\ngot hello\n"
	if out.String() != wantOut || errOut.String() != "oops\n" || res.Exit == nil || res.Exit.ExitCode != 4 {
		t.Fatalf("output %q %q %+v", out.String(), errOut.String(), res)
	}
	if res.Next != int64(len(wantOut)+len("oops\n")) {
		t.Fatalf("next offset %d", res.Next)
	}
	// From an offset: only what follows it. Offsets count stdout and
	// stderr together in the order the agent read them, which is not
	// fixed between two pipes, so this part uses stdout alone.
	two, err := c.StartProcess(ctx, id, corral.StartOptions{Shell: "echo one; echo two"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, id, two.PID); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, err := c.Output(ctx, id, two.PID, corral.OutputOptions{From: int64(len("one\n")), Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "two\n" {
		t.Fatalf("output from offset = %q", out.String())
	}
	if err := c.RemoveProcess(ctx, id, p.PID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Process(ctx, id, p.PID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("removed process: %v", err)
	}
}

func TestProcessErrors(t *testing.T) {
	c, id, url := newSandbox(t)
	ctx := t.Context()
	if _, err := c.StartProcess(ctx, id, corral.StartOptions{}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("neither cmd nor shell: %v", err)
	}
	if _, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sh"}, PTY: &corral.PTYSize{}}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("zero pty size: %v", err)
	}
	if _, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"definitely-not-a-command"}}); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("missing executable: %v", err)
	}
	if _, err := c.Process(ctx, id, 1<<30); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("unknown pid: %v", err)
	}
	if _, err := c.Processes(ctx, "nosuchsandbox"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if _, err := c.Attach(ctx, id, 1<<30, corral.AttachOptions{}); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("attach to an unknown pid: %v", err)
	}
	sleeper, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"pid not a number", "GET", "/processes/abc", "", 400},
		{"pid zero", "GET", "/processes/0", "", 400},
		{"negative pid", "DELETE", "/processes/-3", "", 400},
		{"bad from", "GET", "/processes/1/output?from=-1", "", 400},
		{"bad follow", "GET", "/processes/1/output?follow=maybe", "", 400},
		{"bad signal body", "POST", "/processes/1/signal", `{"sig":"TERM"}`, 400},
		{"empty signal", "POST", "/processes/1/signal", `{"signal":""}`, 400},
		{"zero resize", "POST", "/processes/1/resize", `{"cols":0,"rows":10}`, 400},
		{"attach bad pid", "GET", "/processes/x/attach", "", 400},
		{"attach unknown pid", "GET", "/processes/999999999/attach", "", 404},
		{"attach without upgrade", "GET", "/processes/PID/attach", "", 400},
		{"archive without path", "GET", "/files/archive", "", 400},
		{"watch missing dir", "GET", "/files/watch?path=/no/such/dir", "", 404},
		{"watch bad recursive", "GET", "/files/watch?path=/&recursive=2x", "", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := strings.ReplaceAll(tt.path, "PID", strconv.Itoa(sleeper.PID))
			req, _ := http.NewRequest(tt.method, url+"/v1/sandboxes/"+id+path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s) body %s; want %d", resp.StatusCode, resp.Header.Get("Content-Type"), b, tt.status)
			}
		})
	}
}

// TestOutputFollow follows a running process to its end and checks that
// offsets let a second reader continue without gaps or repeats.
func TestOutputFollow(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{Shell: `for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done`})
	if err != nil {
		t.Fatal(err)
	}
	var first bytes.Buffer
	res, err := c.Output(ctx, id, p.PID, corral.OutputOptions{Stdout: &first})
	if err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	res2, err := c.Output(ctx, id, p.PID, corral.OutputOptions{From: res.Next, Follow: true, Stdout: &rest})
	if err != nil {
		t.Fatal(err)
	}
	if got := first.String() + rest.String(); got != "line1\nline2\nline3\nline4\nline5\n" {
		t.Fatalf("output %q + %q", first.String(), rest.String())
	}
	if res2.Exit == nil || res2.Exit.ExitCode != 0 || res2.Dropped != 0 {
		t.Fatalf("follow result %+v", res2)
	}
}

func TestSignalAndKill(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, id, p.PID, "TERM"); err != nil {
		t.Fatal(err)
	}
	done, err := c.Wait(ctx, id, p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Signal != "SIGTERM" || done.ExitCode == nil || *done.ExitCode != 143 {
		t.Fatalf("after SIGTERM: %+v", done)
	}
	p, err = c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, id, p.PID); err != nil {
		t.Fatal(err)
	}
	if done, err = c.Wait(ctx, id, p.PID); err != nil || done.Signal != "SIGKILL" {
		t.Fatalf("after kill: %+v %v", done, err)
	}
}

// TestAttachPTY drives a terminal over the WebSocket: size, resize, input
// and the exit status.
func TestAttachPTY(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sh"}, PTY: &corral.PTYSize{Cols: 100, Rows: 30}})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	defer inW.Close()
	resize := make(chan corral.PTYSize)
	var out testutil.SyncBuffer
	type result struct {
		res *corral.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Attach(ctx, id, p.PID, corral.AttachOptions{Stdin: inR, Stdout: &out, Resize: resize})
		done <- result{res, err}
	}()
	if _, err := io.WriteString(inW, "stty size\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first stty size", func() bool { return strings.Contains(out.String(), "30 100") })
	resize <- corral.PTYSize{Cols: 120, Rows: 40}
	// The resize and the next line travel separately; ask until the
	// answer reflects it.
	waitFor(t, "the resized stty size", func() bool {
		if strings.Contains(out.String(), "40 120") {
			return true
		}
		_, _ = io.WriteString(inW, "stty size\n")
		time.Sleep(50 * time.Millisecond)
		return false
	})
	if _, err := io.WriteString(inW, "exit 3\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.res.ExitCode != 3 {
			t.Fatalf("attach ended with %+v, %v; output %q", r.res, r.err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("attach did not end after exit; output %q", out.String())
	}
}

// TestAttachPipes: stdout and stderr keep apart, stdin's end closes the
// process's stdin, and output before the attach is replayed.
func TestAttachPipes(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{Shell: `echo before; cat; echo err >&2`, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut testutil.SyncBuffer
	res, err := c.Attach(ctx, id, p.PID, corral.AttachOptions{Stdin: strings.NewReader("typed\n"), CloseStdin: true, Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || out.String() != "before\ntyped\n" || errOut.String() != "err\n" {
		t.Fatalf("attach %+v, stdout %q, stderr %q", res, out.String(), errOut.String())
	}
	// Attaching to an exited process replays it and returns its status.
	// (From 0: an offset counts stdout and stderr together, in the order
	// the agent read them from two pipes, which under load need not be the
	// order they were written in; TestProcessLifecycle covers offsets.)
	out = testutil.SyncBuffer{}
	if res, err = c.Attach(ctx, id, p.PID, corral.AttachOptions{Stdout: &out}); err != nil || res.ExitCode != 0 || out.String() != "before\ntyped\n" {
		t.Fatalf("re-attach: %+v %v %q", res, err, out.String())
	}
}

// TestAttachLeaveAndReturn: a client that goes away leaves the process
// running, and a new attach replays and continues.
func TestAttachLeaveAndReturn(t *testing.T) {
	c, id, _ := newSandbox(t)
	p, err := c.StartProcess(t.Context(), id, corral.StartOptions{Shell: `i=0; while [ $i -lt 100 ]; do echo tick$i; i=$((i+1)); sleep 0.02; done`})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var out testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := c.Attach(ctx, id, p.PID, corral.AttachOptions{Stdout: &out})
		done <- err
	}()
	waitFor(t, "some output", func() bool { return strings.Contains(out.String(), "tick3\n") })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled attach returned %v", err)
	}
	info, err := c.Process(t.Context(), id, p.PID)
	if err != nil || !info.Running {
		t.Fatalf("process after the client left: %+v %v", info, err)
	}
	var again testutil.SyncBuffer
	res, err := c.Attach(t.Context(), id, p.PID, corral.AttachOptions{Stdout: &again})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("re-attach: %+v %v", res, err)
	}
	if !strings.HasPrefix(again.String(), "tick0\n") || !strings.HasSuffix(again.String(), "tick99\n") {
		t.Fatalf("re-attach output %q", again.String())
	}
}

// TestAttachProtocol speaks the WebSocket protocol directly: control
// messages, errors that do not end the session, and the final exit message
// and close status.
func TestAttachProtocol(t *testing.T) {
	c, id, url := newSandbox(t)
	ctx := t.Context()
	p, err := c.StartProcess(ctx, id, corral.StartOptions{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := websocket.Dial(ctx, url+"/v1/sandboxes/"+id+"/processes/"+strconv.Itoa(p.PID)+"/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	readText := func() AttachEvent {
		t.Helper()
		typ, msg, err := conn.Read(ctx)
		if err != nil || typ != websocket.MessageText {
			t.Fatalf("read %v %q %v", typ, msg, err)
		}
		var ev AttachEvent
		if err := json.Unmarshal(msg, &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := readText(); ev.Type != "start" || ev.PID != p.PID {
		t.Fatalf("first message %+v", ev)
	}
	for _, msg := range []string{`{"type":"dance"}`, `not json`, `{"type":"resize","cols":0,"rows":0}`} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if ev := readText(); ev.Type != "error" || ev.Error == nil || ev.Error.Code != "invalid_argument" {
			t.Fatalf("after %s: %+v", msg, ev)
		}
	}
	if err := conn.Write(ctx, websocket.MessageBinary, []byte{7, 'x'}); err != nil {
		t.Fatal(err)
	}
	if ev := readText(); ev.Type != "error" {
		t.Fatalf("after a binary message without the stdin prefix: %+v", ev)
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"signal","signal":"SIGINT"}`)); err != nil {
		t.Fatal(err)
	}
	ev := readText()
	if ev.Type != "exit" || ev.Signal != "SIGINT" || ev.ExitCode == nil || *ev.ExitCode != 130 {
		t.Fatalf("exit message %+v", ev)
	}
	_, _, err = conn.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after exit: %v, want a normal close", err)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"a.txt": "alpha", "d/e/b.bin": "\x00\x01\x02", "d/c.txt": strings.Repeat("c", 100000)}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.UploadDir(ctx, id, src, "/up/tree"); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat(ctx, id, "/up/tree/d/e/b.bin")
	if err != nil || fi.Size != 3 || fi.Mode != 0o600 {
		t.Fatalf("uploaded file: %+v %v", fi, err)
	}
	dst := filepath.Join(t.TempDir(), "back")
	if err := c.DownloadDir(ctx, id, "/up/tree", dst); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || string(got) != body {
			t.Fatalf("%s came back as %d bytes, %v", name, len(got), err)
		}
	}
	if _, err := c.Download(ctx, id, "/no/such/dir"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("download of a missing path: %v", err)
	}
}

// TestArchiveUploadRefusesEscapes: the sandbox refuses tar entries that
// leave the target directory, and writes nothing outside it.
func TestArchiveUploadRefusesEscapes(t *testing.T) {
	c, id, _ := newSandbox(t)
	ctx := t.Context()
	tests := []struct {
		name    string
		entries []*tar.Header
	}{
		{"dot dot", []*tar.Header{{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"absolute", []*tar.Header{{Name: "/escaped", Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"through symlink", []*tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"},
			{Name: "l/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tt.entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			err := c.Upload(ctx, id, "/target/"+strings.ReplaceAll(tt.name, " ", "-"), &buf)
			if corral.ErrorCode(err) != corral.CodeInvalidArgument {
				t.Fatalf("upload: %v; want invalid_argument", err)
			}
			if _, err := c.Stat(ctx, id, "/escaped"); corral.ErrorCode(err) != corral.CodeNotFound {
				t.Fatalf("/escaped exists in the sandbox: %v", err)
			}
		})
	}
}

func TestWatch(t *testing.T) {
	c, id, _ := newSandbox(t)
	if _, err := c.Mkdir(t.Context(), id, "/w/sub", true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events := make(chan corral.WatchEvent, 64)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, id, "/w", true, func(ev corral.WatchEvent) error {
			events <- ev
			return nil
		})
	}()
	// The watch is in place a moment after the stream starts: write until
	// an event shows up.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for seen := false; !seen; {
		select {
		case ev := <-events:
			seen = ev.Path == "/w/sub/f.txt"
		case <-tick.C:
			if _, err := c.WriteFile(t.Context(), id, "/w/sub/f.txt", strings.NewReader("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("no watch event for /w/sub/f.txt")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("watch ended with %v", err)
	}
}

// TestAttachClientLeavesWithStdinOpen: a client that vanishes in the
// middle of typing ends its session (and the stdin stream) without taking
// the terminal's process with it.
func TestAttachClientLeavesWithStdinOpen(t *testing.T) {
	c, _ := newTestServer(t, "k3y") // attach carries the API key too
	sb, err := c.Create(t.Context(), corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.StartProcess(t.Context(), sb.ID, corral.StartOptions{Cmd: []string{"sh"}, PTY: &corral.PTYSize{Cols: 80, Rows: 24}})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	defer inW.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var out testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := c.Attach(ctx, sb.ID, p.PID, corral.AttachOptions{Stdin: inR, Stdout: &out})
		done <- err
	}()
	if _, err := io.WriteString(inW, "echo $((40+2))\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the echo", func() bool { return strings.Contains(out.String(), "42") })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("attach returned %v", err)
	}
	info, err := c.Process(t.Context(), sb.ID, p.PID)
	if err != nil || !info.Running {
		t.Fatalf("shell after the client left: %+v %v", info, err)
	}
	if err := c.RemoveProcess(t.Context(), sb.ID, p.PID); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAttachKeystroke measures one key's round trip through an
// attach session: WebSocket in, the stdin stream, a terminal's echo, and
// the output stream back.
func BenchmarkAttachKeystroke(b *testing.B) {
	c, _ := newTestServer(b, "")
	sb, err := c.Create(b.Context(), corral.CreateOptions{Template: "bb"})
	if err != nil {
		b.Fatal(err)
	}
	p, err := c.StartProcess(b.Context(), sb.ID, corral.StartOptions{Cmd: []string{"cat"}, PTY: &corral.PTYSize{Cols: 80, Rows: 24}})
	if err != nil {
		b.Fatal(err)
	}
	inR, inW := io.Pipe()
	defer inW.Close()
	echoes := make(chan struct{}, 1024)
	out := writerFunc(func(p []byte) (int, error) {
		for range bytes.Count(p, []byte("x")) {
			echoes <- struct{}{}
		}
		return len(p), nil
	})
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Attach(ctx, sb.ID, p.PID, corral.AttachOptions{Stdin: inR, Stdout: out})
	}()
	b.ResetTimer()
	for b.Loop() {
		if _, err := inW.Write([]byte("x")); err != nil {
			b.Fatal(err)
		}
		<-echoes
	}
	b.StopTimer()
	cancel()
	<-done
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
