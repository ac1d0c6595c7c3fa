package agentserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

func TestHealth(t *testing.T) {
	a := startAgent(t)
	got, err := a.client.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := wire.Health{OK: true, Version: "test", PID: os.Getpid()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("health (-want +got):\n%s", diff)
	}
}

func TestExec(t *testing.T) {
	a := startAgent(t)
	cwd, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home, user := "/", ""
	if os.Geteuid() == 0 {
		home, user = "/root", "root"
	}
	defaultCwd := home
	if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
		defaultCwd = "/"
	}
	bigStdin := make([]byte, 1<<20)
	rand.Read(bigStdin)

	tests := []struct {
		name       string
		req        wire.ExecRequest
		wantStdout string
		wantStderr string
		wantCode   int
		wantSignal string
		wantBinary bool
	}{
		{name: "argv", req: wire.ExecRequest{Cmd: []string{"echo", "hello", "world"}}, wantStdout: "hello world\n"},
		{name: "absolute argv", req: wire.ExecRequest{Cmd: []string{"/bin/echo", "hi"}}, wantStdout: "hi\n"},
		{name: "shell", req: wire.ExecRequest{Shell: "echo a && echo b"}, wantStdout: "a\nb\n"},
		{name: "exit code", req: wire.ExecRequest{Shell: "exit 7"}, wantCode: 7},
		{name: "stderr", req: wire.ExecRequest{Shell: "echo err >&2"}, wantStderr: "err\n"},
		{name: "killed by SIGKILL", req: wire.ExecRequest{Shell: "kill -KILL $$"}, wantCode: 137, wantSignal: "SIGKILL"},
		{name: "killed by SIGTERM", req: wire.ExecRequest{Shell: "kill -TERM $$"}, wantCode: 143, wantSignal: "SIGTERM"},
		{name: "stdin", req: wire.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("from stdin")}, wantStdout: "from stdin"},
		{name: "no stdin is /dev/null", req: wire.ExecRequest{Shell: "cat; echo done"}, wantStdout: "done\n"},
		{name: "large stdin", req: wire.ExecRequest{Cmd: []string{"cat"}, Stdin: bigStdin}, wantStdout: string(bigStdin), wantBinary: true},
		{name: "binary output", req: wire.ExecRequest{Shell: `printf '\377\376\000x'`}, wantStdout: "\xff\xfe\x00x", wantBinary: true},
		{name: "large output", req: wire.ExecRequest{Shell: "head -c 3000000 /dev/zero"}, wantStdout: strings.Repeat("\x00", 3000000)},
		{name: "html characters", req: wire.ExecRequest{Shell: `echo '<a & b>'`}, wantStdout: "<a & b>\n"},
		{
			name:       "env",
			req:        wire.ExecRequest{Shell: `echo "$FOO|$PATH|$HOME|$USER"`, Env: map[string]string{"FOO": "bar baz"}},
			wantStdout: "bar baz|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|" + home + "|" + user + "\n",
		},
		{
			name:       "env overrides base",
			req:        wire.ExecRequest{Shell: `echo "$PATH|$HOME"`, Env: map[string]string{"PATH": "/bin:/usr/bin", "HOME": "/elsewhere"}},
			wantStdout: "/bin:/usr/bin|/elsewhere\n",
		},
		{name: "env is not inherited", req: wire.ExecRequest{Shell: `echo "${GOPATH-unset}"`}, wantStdout: "unset\n"},
		{name: "cwd", req: wire.ExecRequest{Cmd: []string{"pwd"}, Cwd: cwd}, wantStdout: cwd + "\n"},
		{name: "default cwd is home", req: wire.ExecRequest{Cmd: []string{"pwd"}}, wantStdout: defaultCwd + "\n"},
		{name: "own process group", req: wire.ExecRequest{Shell: `[ "$(cut -d' ' -f5 /proc/$$/stat)" -eq $$ ] && echo leader`}, wantStdout: "leader\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := runExec(t.Context(), a.client, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.pid <= 0 {
				t.Errorf("start event pid = %d", res.pid)
			}
			if !bytes.Equal(res.stdout, []byte(tt.wantStdout)) {
				t.Errorf("stdout = %q, want %q", truncate(res.stdout), truncate([]byte(tt.wantStdout)))
			}
			if string(res.stderr) != tt.wantStderr {
				t.Errorf("stderr = %q, want %q", res.stderr, tt.wantStderr)
			}
			if res.code() != tt.wantCode || res.exit.Signal != tt.wantSignal || res.exit.TimedOut {
				t.Errorf("exit = code %d signal %q timed out %v, want code %d signal %q", res.code(), res.exit.Signal, res.exit.TimedOut, tt.wantCode, tt.wantSignal)
			}
			if res.binary != tt.wantBinary {
				t.Errorf("output as Data = %v, want %v", res.binary, tt.wantBinary)
			}
		})
	}
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

func TestExecStartErrors(t *testing.T) {
	a := startAgent(t)
	noExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  wire.ExecRequest
		want error
	}{
		{"not in PATH", wire.ExecRequest{Cmd: []string{"corral-no-such-command"}}, errdefs.ErrNotFound},
		{"missing path", wire.ExecRequest{Cmd: []string{"/no/such/binary"}}, errdefs.ErrNotFound},
		{"not executable", wire.ExecRequest{Cmd: []string{noExec}}, errdefs.ErrPermissionDenied},
		{"PATH from request", wire.ExecRequest{Cmd: []string{"sh"}, Env: map[string]string{"PATH": "/nonexistent"}}, errdefs.ErrNotFound},
		{"missing cwd", wire.ExecRequest{Cmd: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.ErrInvalidArgument},
		{"cwd is a file", wire.ExecRequest{Cmd: []string{"true"}, Cwd: notDir}, errdefs.ErrInvalidArgument},
		{"relative cwd", wire.ExecRequest{Cmd: []string{"true"}, Cwd: "tmp"}, errdefs.ErrInvalidArgument},
		{"cmd and shell", wire.ExecRequest{Cmd: []string{"true"}, Shell: "true"}, errdefs.ErrInvalidArgument},
		{"neither cmd nor shell", wire.ExecRequest{}, errdefs.ErrInvalidArgument},
		{"empty command", wire.ExecRequest{Cmd: []string{""}}, errdefs.ErrInvalidArgument},
		{"unknown user", wire.ExecRequest{Cmd: []string{"true"}, User: "nobody-here"}, errdefs.ErrInvalidArgument},
		{"unknown group", wire.ExecRequest{Cmd: []string{"true"}, User: "0:nogroup-here"}, errdefs.ErrInvalidArgument},
		{"bad env name", wire.ExecRequest{Cmd: []string{"true"}, Env: map[string]string{"A=B": "c"}}, errdefs.ErrInvalidArgument},
		{"negative timeout", wire.ExecRequest{Cmd: []string{"true"}, TimeoutMS: -1}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := 0
			err := a.client.Exec(t.Context(), tt.req, func(wire.ExecEvent) error { events++; return nil })
			if !errors.Is(err, tt.want) {
				t.Fatalf("Exec error = %v, want kind %v", err, tt.want)
			}
			if events != 0 {
				t.Fatalf("got %d events before the error, want none", events)
			}
		})
	}
}

func TestExecTimeout(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	res, err := runExec(t.Context(), a.client, wire.ExecRequest{Shell: "sleep 30 & sleep 30; echo never", TimeoutMS: 100})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timed-out exec took %v", d)
	}
	if !res.exit.TimedOut || res.code() != 137 || res.exit.Signal != "SIGKILL" {
		t.Fatalf("exit = %+v (code %d), want timed out by SIGKILL with code 137", res.exit, res.code())
	}
	if len(res.stdout) != 0 {
		t.Fatalf("stdout = %q", res.stdout)
	}
}

// A background grandchild that keeps stdout open must not hold the exec's
// exit back for long.
func TestExecBackgroundGrandchild(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	res, err := runExec(t.Context(), a.client, wire.ExecRequest{Shell: "sleep 30 & echo $!"})
	if err != nil {
		t.Fatal(err)
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(string(res.stdout)))
	if err != nil {
		t.Fatalf("stdout %q: %v", res.stdout, err)
	}
	killLater(t, grandchild)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("exec with a background grandchild took %v", d)
	}
	if res.code() != 0 {
		t.Fatalf("exit code = %d", res.code())
	}
}

// Canceling the client's context kills the whole process group.
func TestExecClientCancelKills(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var pid, grandchild int
	err := a.client.Exec(ctx, wire.ExecRequest{Shell: "sleep 60 & echo $!; wait"}, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStart:
			pid = ev.PID
		case wire.EventStdout:
			n, err := strconv.Atoi(strings.TrimSpace(ev.Text))
			if err != nil {
				return err
			}
			grandchild = n
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec error = %v, want context.Canceled", err)
	}
	if pid == 0 || grandchild == 0 {
		t.Fatalf("pid %d, grandchild %d", pid, grandchild)
	}
	killLater(t, grandchild) // only acts if the agent failed to
	waitGone(t, pid)
	waitGone(t, grandchild)
}

// An error from the event callback ends the exec like a disconnect.
func TestExecCallbackErrorKills(t *testing.T) {
	a := startAgent(t)
	errStop := errors.New("stop")
	var pid int
	err := a.client.Exec(t.Context(), wire.ExecRequest{Cmd: []string{"sleep", "60"}}, func(ev wire.ExecEvent) error {
		pid = ev.PID
		return errStop
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("Exec error = %v, want %v", err, errStop)
	}
	waitGone(t, pid)
}

// Close kills running processes; their streams still end with an exit
// event, and later execs are refused.
func TestCloseKillsProcesses(t *testing.T) {
	a := startAgent(t)
	running := make(chan struct{})
	var res execResult
	var execErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		execErr = a.client.Exec(t.Context(), wire.ExecRequest{Shell: "echo up; exec sleep 60"}, func(ev wire.ExecEvent) error {
			switch ev.Type {
			case wire.EventStart:
				res.pid = ev.PID
			case wire.EventStdout:
				close(running)
			case wire.EventExit:
				res.exit = ev
			}
			return nil
		})
	}()
	select {
	case <-running:
	case <-time.After(5 * time.Second):
		t.Fatal("process did not start")
	}
	if err := a.srv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if execErr != nil {
		t.Fatal(execErr)
	}
	if res.code() != 137 || res.exit.Signal != "SIGKILL" {
		t.Fatalf("exit = %+v, want SIGKILL", res.exit)
	}
	waitGone(t, res.pid)
	_, err := runExec(t.Context(), a.client, wire.ExecRequest{Cmd: []string{"true"}})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("exec after Close: %v, want ErrUnavailable", err)
	}
}

// writeUserDB writes a passwd and group file under root/etc.
func writeUserDB(t *testing.T, root string) {
	t.Helper()
	files := map[string]string{
		"etc/passwd": "# comment\nroot:x:0:0:root:/root:/bin/sh\nalice:x:1234:1235:Alice:/home/alice:/bin/sh\n",
		"etc/group":  "root:x:0:\nalice:x:1235:\nextra:x:2000:bob,alice\nother:x:2001:bob\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestExecUser(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	writeUserDB(t, root)
	a := startAgentWith(t, agentserver.Options{Root: root})
	const script = `echo "$(id -u) $(id -g) $(id -G) $HOME ${USER-none} $(pwd)"`
	tests := []struct {
		user string
		want string
	}{
		{"alice", "1234 1235 1235 2000 /home/alice alice /\n"},
		{"alice:extra", "1234 2000 2000 /home/alice alice /\n"},
		{"1234", "1234 1235 1235 2000 /home/alice alice /\n"},
		{"4321", "4321 0 0 / none /\n"},
		{"4321:77", "4321 77 77 / none /\n"},
		{"root", "0 0 0 /root root /root\n"},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			res, err := runExec(t.Context(), a.client, wire.ExecRequest{Shell: script, User: tt.user})
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if tt.user == "root" {
				if fi, err := os.Stat("/root"); err != nil || !fi.IsDir() {
					want = "0 0 0 /root root /\n"
				}
			}
			if string(res.stdout) != want || res.code() != 0 {
				t.Fatalf("stdout %q stderr %q code %d, want %q", res.stdout, res.stderr, res.code(), want)
			}
		})
	}
}

// An Init server reaps every child, not only its own; it must still hand
// each exec its status. This runs the reaper inside the test process, so
// nothing else here may wait for children meanwhile (tests are serial).
func TestExecInitReaper(t *testing.T) {
	a := startAgentWith(t, agentserver.Options{Root: t.TempDir(), Init: true})
	for i := range 20 {
		res, err := runExec(t.Context(), a.client, wire.ExecRequest{Shell: "exit " + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		if res.code() != i {
			t.Fatalf("exec %d: exit code %d", i, res.code())
		}
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runExec(t.Context(), a.client, wire.ExecRequest{Shell: "echo " + strconv.Itoa(i) + "; exit " + strconv.Itoa(i)})
			if err != nil || res.code() != i || string(res.stdout) != strconv.Itoa(i)+"\n" {
				t.Errorf("concurrent exec %d: %v, code %d, stdout %q", i, err, res.code(), res.stdout)
			}
		}()
	}
	wg.Wait()
}

// A client that reads slowly still gets every byte the process wrote
// before it exited, even past the drain timeout.
func TestExecSlowReaderKeepsOutput(t *testing.T) {
	a := startAgent(t)
	var got int
	err := a.client.Exec(t.Context(), wire.ExecRequest{Shell: "head -c 300000 /dev/zero; echo -n end >&2"}, func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventStdout {
			if got == 0 {
				time.Sleep(200 * time.Millisecond) // the process exits meanwhile
			}
			got += len(ev.Bytes())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != 300000 {
		t.Fatalf("got %d bytes of stdout, want 300000", got)
	}
}

func TestExecOutputLimit(t *testing.T) {
	c := startAgent(t).client
	var stdout, stderr int64
	var marker string
	var exit wire.ExecEvent
	err := c.Exec(t.Context(), wire.ExecRequest{Shell: "yes | head -c 3000000; echo done >&2", MaxOutputBytes: 1 << 20}, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout:
			stdout += int64(len(ev.Bytes()))
		case wire.EventStderr:
			stderr += int64(len(ev.Bytes()))
			marker += string(ev.Bytes())
		case wire.EventExit:
			exit = ev
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stdout != 1<<20 {
		t.Errorf("stdout bytes = %d, want exactly %d", stdout, 1<<20)
	}
	if !strings.Contains(marker, "[corral: output truncated at 1048576 bytes]") {
		t.Errorf("no truncation marker on stderr: %q", marker)
	}
	if !exit.OutputTruncated || exit.OutputDiscarded != 3000000+int64(len("done\n"))-(1<<20) {
		t.Errorf("exit event %+v: want truncated with %d discarded", exit, 3000000+5-(1<<20))
	}
	if exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("process did not finish normally: %+v", exit)
	}
}
