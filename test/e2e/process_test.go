package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// e2eStorage is the storage of the tests in this file and files_test.go:
// the default one.
const e2eStorage = "btrfs"

// tmux is a tmux server of one test, on its own socket; kill stops only
// that server.
type tmux struct {
	t      *testing.T
	socket string
	conf   string
}

func newTmux(t *testing.T) *tmux {
	t.Helper()
	testutil.RequiresBinary(t, "tmux")
	conf := filepath.Join(t.TempDir(), "tmux.conf")
	// No status line: the pane is the whole window, so its size is the
	// size asked for.
	if err := os.WriteFile(conf, []byte("set -g status off\nset -g history-limit 5000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tm := &tmux{t: t, socket: "corral-e2e-" + randHex(4), conf: conf}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", tm.socket, "kill-server").Run() })
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket, "-f", tm.conf}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// pane returns the visible text of the session's pane.
func (tm *tmux) pane() string { return tm.run("capture-pane", "-p", "-t", "main") }

// waitPane polls the pane until it contains want.
func (tm *tmux) waitPane(want string, retry func()) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := tm.pane()
		if strings.Contains(p, want) {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("pane never showed %q; it shows:\n%s", want, p)
		}
		if retry != nil {
			retry()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestShellUnderTmux drives `corral shell` in a real terminal: the remote
// terminal has the local size, follows a resize, and the CLI exits with
// the shell's status.
func TestShellUnderTmux(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	tm := newTmux(t)
	exitFile := filepath.Join(t.TempDir(), "exit")
	cmdline := fmt.Sprintf("CORRAL_HOST=unix://%s %s shell %s; echo EXIT=$? > %s; sleep 60", d.Socket, d.Bin, sb.ID, exitFile)
	tm.run("new-session", "-d", "-s", "main", "-x", "100", "-y", "30", cmdline)
	// The prompt of busybox's sh ends in "# " for root.
	tm.waitPane("#", nil)
	tm.run("send-keys", "-t", "main", "stty size", "Enter")
	tm.waitPane("30 100", nil)

	tm.run("resize-window", "-t", "main", "-x", "120", "-y", "40")
	// The new size travels SIGWINCH -> CLI -> daemon -> agent; ask again
	// until the answer has it.
	tm.waitPane("40 120", func() { tm.run("send-keys", "-t", "main", "stty size", "Enter") })

	tm.run("send-keys", "-t", "main", "exit 3", "Enter")
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(exitFile)
		if strings.TrimSpace(string(b)) == "EXIT=3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exit file says %q; pane:\n%s", b, tm.pane())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The shell's process went with the session.
	list, err := d.Client.Processes(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.Tag == "shell" {
			t.Errorf("shell process left behind: %+v", p)
		}
	}
}

// TestShellPipedInput: without a terminal, `corral shell` uses 80x24 and
// still exits with the remote status.
func TestShellPipedInput(t *testing.T) {
	d := startDaemon(t, "overlay")
	sb := d.create(t, corral.CreateOptions{})
	cmd := exec.Command(d.Bin, "shell", sb.ID)
	cmd.Env = append(os.Environ(), "CORRAL_HOST=unix://"+d.Socket)
	cmd.Stdin = strings.NewReader("stty size\nexit 5\n")
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
		t.Fatalf("corral shell: %v, output %q", err, out)
	}
	if !strings.Contains(string(out), "24 80") {
		t.Fatalf("output %q has no 24 80", out)
	}
}

// stamps returns the whole seconds of the `date +%s.%N` lines in out.
func stamps(out string) []int64 {
	var s []int64
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		sec, _, _ := strings.Cut(strings.TrimSpace(sc.Text()), ".")
		if v, err := strconv.ParseInt(sec, 10, 64); err == nil {
			s = append(s, v)
		}
	}
	return s
}

// TestBackgroundSurvivesDaemonRestart: a background process keeps running
// through a daemon SIGKILL and restart, is listed afterwards, and a
// re-attach from offset 0 shows its output from before and after.
func TestBackgroundSurvivesDaemonRestart(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	out, errOut, code := d.corral("exec", "-d", "--tag", "clock", sb.ID, "--", "sh", "-c", "while true; do date +%s.%N; sleep 0.2; done")
	if code != 0 {
		t.Fatalf("exec -d: %d %s", code, errOut)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("exec -d printed %q", out)
	}
	time.Sleep(time.Second)
	before, _, code := d.corral("logs", sb.ID, strconv.Itoa(pid))
	if code != 0 || len(stamps(before)) < 2 {
		t.Fatalf("logs before restart: %d %q", code, before)
	}

	killedAt := time.Now().Unix()
	d.Kill()
	time.Sleep(2 * time.Second) // distinct seconds on both sides
	d.Start()
	restartedAt := time.Now().Unix()

	ps, _, code := d.corral("ps", sb.ID)
	if code != 0 || !strings.Contains(ps, strconv.Itoa(pid)) || !strings.Contains(ps, "running") || !strings.Contains(ps, "clock") {
		t.Fatalf("ps after restart (%d):\n%s", code, ps)
	}
	attachAcrossRestart(t, d, sb.ID, pid, killedAt, restartedAt)

	if _, errOut, code := d.corral("kill", "-s", "TERM", sb.ID, strconv.Itoa(pid)); code != 0 {
		t.Fatalf("kill: %d %s", code, errOut)
	}
	p, err := d.Client.Wait(t.Context(), sb.ID, pid)
	if err != nil || p.Signal != "SIGTERM" {
		t.Fatalf("after kill: %+v %v", p, err)
	}
	ps, _, _ = d.corral("ps", sb.ID)
	if !strings.Contains(ps, "killed (SIGTERM)") {
		t.Fatalf("ps after kill:\n%s", ps)
	}
}

// attachAcrossRestart attaches from offset 0 over the WebSocket to
// process pid, which prints a time stamp a line, until a line from after
// the daemon's restart arrives, and fails unless the output spans the
// restart (killed and restarted are Unix seconds).
func attachAcrossRestart(t *testing.T, d *daemon, id string, pid int, killed, restarted int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var buf testutil.SyncBuffer
	var seenAfter sync.Once
	w := writerFunc(func(p []byte) (int, error) {
		n, err := buf.Write(p)
		for _, s := range stamps(buf.String()) {
			if s > restarted {
				seenAfter.Do(cancel)
			}
		}
		return n, err
	})
	_, err := d.Client.Attach(ctx, id, pid, corral.AttachOptions{Stdout: w})
	if ctx.Err() == nil || t.Context().Err() != nil {
		t.Fatalf("attach ended early: %v", err)
	}
	got := stamps(buf.String())
	if len(got) == 0 || got[0] >= killed || got[len(got)-1] <= restarted {
		t.Fatalf("re-attach output does not span the restart (killed %d, restarted %d):\n%s", killed, restarted, buf.String())
	}
}

// TestLogsAndAttachCLI covers `corral logs -f`, `--from` and `corral
// attach` on a pipe process.
func TestLogsAndAttachCLI(t *testing.T) {
	d := startDaemon(t, "overlay")
	sb := d.create(t, corral.CreateOptions{})
	out, errOut, code := d.corral("exec", "-d", sb.ID, "--", "sh", "-c", "echo one; sleep 1; echo two >&2; sleep 1; exit 6")
	if code != 0 {
		t.Fatalf("exec -d: %d %s", code, errOut)
	}
	pid := strings.TrimSpace(out)
	out, errOut, code = d.corral("logs", "-f", sb.ID, pid)
	if code != 0 || out != "one\n" || errOut != "two\n" {
		t.Fatalf("logs -f: %d %q %q", code, out, errOut)
	}
	if out, _, _ = d.corral("logs", "--from", "2", sb.ID, pid); out != "e\n" {
		t.Fatalf("logs --from 2: %q", out)
	}
	out, errOut, code = d.corral("attach", sb.ID, pid)
	if code != 6 || out != "one\n" || errOut != "two\n" {
		t.Fatalf("attach to an exited process: %d %q %q", code, out, errOut)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
