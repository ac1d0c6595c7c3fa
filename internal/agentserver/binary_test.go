package agentserver_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/seccomp"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// agentProcess is the agent binary started as a driver starts it.
type agentProcess struct {
	cmd    *exec.Cmd
	client *agentclient.Client
	ready  string // the line written to the ready fd
	log    *os.File
}

// startAgentBinary starts the real binary bin as `bin agent ARGS...`,
// with the listening socket as fd 4 and the ready pipe as fd 3, and waits
// until it reports on the pipe.
func startAgentBinary(t *testing.T, bin string, sys *syscall.SysProcAttr, args ...string) *agentProcess {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	lf, err := ul.File()
	if err != nil {
		t.Fatal(err)
	}
	ul.Close()
	defer lf.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	// The agent's stderr is a plain file, as drivers give it.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })

	if args == nil {
		args = []string{"--listen-fd=4", "--ready-fd=3"}
	}
	cmd := exec.Command(bin, append([]string{"agent"}, args...)...)
	cmd.ExtraFiles = []*os.File{readyW, lf}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sys
	if err := cmd.Start(); err != nil {
		readyW.Close()
		t.Fatal(err)
	}
	readyW.Close()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})

	line := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(readyR)
		line <- string(b)
	}()
	var ready string
	select {
	case ready = <-line:
	case <-time.After(10 * time.Second):
		readyR.Close()
		t.Fatalf("agent did not report on the ready fd; log:\n%s", readLog(logFile))
	}
	var d net.Dialer
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) })
	t.Cleanup(func() { c.Close() })
	return &agentProcess{cmd: cmd, client: c, ready: ready, log: logFile}
}

func readLog(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

// failedExit waits for an agent whose start-up failed to exit and returns
// its exit code; one still running after 10 s is killed and fails the test.
func (p *agentProcess) failedExit(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
		t.Errorf("agent still running after its start-up failed; log:\n%s", readLog(p.log))
	}
	return p.cmd.ProcessState.ExitCode()
}

// stop sends SIGTERM and returns the exit code.
func (p *agentProcess) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("agent did not exit on SIGTERM; log:\n%s", readLog(p.log))
	}
	return p.cmd.ProcessState.ExitCode()
}

// TestAgentBinary runs both binaries that hold the agent: corral-agent,
// which the daemon prefers, and corral itself (`corral agent`).
func TestAgentBinary(t *testing.T) {
	for name, bin := range map[string]func(testing.TB) string{"corral-agent": testutil.AgentBinary, "corral": testutil.CorralBinary} {
		t.Run(name, func(t *testing.T) { testAgentBinary(t, bin(t)) })
	}
}

func testAgentBinary(t *testing.T, bin string) {
	p := startAgentBinary(t, bin, nil)
	if p.ready != "ok\n" {
		t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
	}
	h, err := p.client.Health(t.Context())
	if err != nil || !h.OK || h.PID != p.cmd.Process.Pid {
		t.Fatalf("health = %+v, %v", h, err)
	}
	// The agent's inherited descriptors must not reach its processes.
	res, err := runExec(t.Context(), p.client, wire.ExecRequest{Shell: "echo hi; ls /proc/self/fd"})
	if err != nil {
		t.Fatal(err)
	}
	if res.code() != 0 || !strings.HasPrefix(string(res.stdout), "hi\n") {
		t.Fatalf("exec: code %d, stdout %q, stderr %q", res.code(), res.stdout, res.stderr)
	}
	if fds := strings.Fields(string(res.stdout[3:])); len(fds) > 4 { // 0, 1, 2 and ls's own directory fd
		t.Fatalf("process has fds %v, want only stdio", fds)
	}

	// A process running at SIGTERM is killed, and the agent exits 0.
	running := make(chan int, 1)
	execDone := make(chan execResult, 1)
	go func() {
		var r execResult
		p.client.Exec(context.Background(), wire.ExecRequest{Cmd: []string{"sleep", "60"}}, func(ev wire.ExecEvent) error {
			switch ev.Type {
			case wire.EventStart:
				running <- ev.PID
			case wire.EventExit:
				r.exit = ev
			}
			return nil
		})
		execDone <- r
	}()
	pid := <-running
	if code := p.stop(t); code != 0 {
		t.Fatalf("agent exit code %d; log:\n%s", code, readLog(p.log))
	}
	if r := <-execDone; r.exit.Signal != "SIGKILL" {
		t.Errorf("running exec ended with %+v, want SIGKILL", r.exit)
	}
	waitGone(t, pid)
	if log := readLog(p.log); !strings.Contains(log, "agent ready") || !strings.Contains(log, "shutting down") {
		t.Errorf("log does not tell start and shutdown:\n%s", log)
	}
}

func TestAgentBinaryStartupError(t *testing.T) {
	p := startAgentBinary(t, testutil.AgentBinary(t), nil, "--listen-fd=9", "--ready-fd=3")
	if !strings.HasPrefix(p.ready, "error: ") || !strings.HasSuffix(p.ready, "\n") || strings.Count(p.ready, "\n") != 1 {
		t.Fatalf("ready fd said %q, want one error line", p.ready)
	}
	if code := p.failedExit(t); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}

// With --seccomp the agent installs the filter on itself before it reports
// ready, and every process it starts inherits it; a program it cannot
// decode or install stops the start-up. With --spawn-thread the filter goes
// on the one thread that starts processes instead of on every thread.
func TestAgentBinarySeccomp(t *testing.T) {
	prog, err := seccomp.Compile(seccomp.Profile(seccomp.Options{Arch: runtime.GOARCH}))
	if err != nil {
		t.Skipf("no seccomp compiler here: %v", err)
	}
	// The program may also come in a file (gVisor).
	file := filepath.Join(t.TempDir(), "seccomp")
	if err := os.WriteFile(file, []byte(seccomp.Encode(prog)), 0o444); err != nil {
		t.Fatal(err)
	}
	// Or in an environment variable (gVisor), which the agent reads once.
	t.Setenv("CORRAL_TEST_SECCOMP", seccomp.Encode(prog))
	t.Setenv("CORRAL_TEST_SECCOMP_BAD", "not base64!")
	inBothModes(t, func(t *testing.T, oneThread bool, args []string) {
		for _, bad := range []string{
			"--seccomp=not base64!", "--seccomp=" + seccomp.Encode(prog[:3]),
			"--seccomp-file=" + file + ".missing", "--seccomp-file=" + filepath.Dir(file),
			"--seccomp-env=CORRAL_TEST_SECCOMP_BAD",
		} {
			p := startAgentBinary(t, testutil.AgentBinary(t), nil, append(args, bad)...)
			if !strings.HasPrefix(p.ready, "error: ") {
				t.Errorf("%.40q: ready fd said %q, want an error", bad, p.ready)
			}
			if code := p.failedExit(t); code != 1 {
				t.Errorf("%.40q: exit code %d, want 1", bad, code)
			}
		}
		for _, arg := range []string{"--seccomp=" + seccomp.Encode(prog), "--seccomp-file=" + file, "--seccomp-env=CORRAL_TEST_SECCOMP"} {
			t.Run(strings.SplitN(arg, "=", 2)[0], func(t *testing.T) { testAgentSeccomp(t, oneThread, append(args, arg)...) })
		}
	})
}

// inBothModes runs f in a subtest per way the agent can carry its filter:
// on every thread, and with --spawn-thread (oneThread) on the threads
// that start processes. args are the agent's flags for the mode, after
// the listening and ready fds; appending to them copies.
func inBothModes(t *testing.T, f func(t *testing.T, oneThread bool, args []string)) {
	for _, oneThread := range []bool{false, true} {
		name, args := "every-thread", []string{"--listen-fd=4", "--ready-fd=3"}
		if oneThread {
			name, args = "spawn-thread", append(args, "--spawn-thread")
		}
		t.Run(name, func(t *testing.T) { f(t, oneThread, slices.Clip(args)) })
	}
}

func testAgentSeccomp(t *testing.T, oneThread bool, args ...string) {
	p := startAgentBinary(t, testutil.AgentBinary(t), nil, args...)
	if p.ready != "ok\n" {
		t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
	}
	// Processes started one after the other and at once all carry it.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			res, err := runExec(t.Context(), p.client, wire.ExecRequest{Shell: "grep '^Seccomp:' /proc/self/status; unshare -U true && echo unshared"})
			if err != nil {
				t.Error(err)
				return
			}
			if out := string(res.stdout); !strings.HasPrefix(out, "Seccomp:\t2\n") || strings.Contains(out, "unshared") {
				t.Errorf("process under the agent: %q, stderr %q", out, res.stderr)
			}
		})
	}
	wg.Wait()
	pid := strconv.Itoa(p.cmd.Process.Pid)
	tasks, _ := os.ReadDir("/proc/" + pid + "/task")
	filtered := 0
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/status")
		if bytes.Contains(b, []byte("\nSeccomp:\t2\n")) {
			filtered++
		} else if !oneThread {
			t.Errorf("agent thread %s has no filter", task.Name())
		}
	}
	// The spawner's threads only (Go makes no thread from a locked one):
	// one, and one more for each start that found all busy.
	if oneThread && (filtered < 1 || filtered > agentserver.MaxSpawnThreads || filtered == len(tasks)) {
		t.Errorf("%d of %d agent threads filtered, want 1 to %d and not all", filtered, len(tasks), agentserver.MaxSpawnThreads)
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("agent exit code %d", code)
	}
}

// With --limits the agent writes each FILE=VALUE line of the file (or,
// with --limits-env, of the environment variable) before it reports
// ready; a file it cannot read or write, or a malformed line, stops the
// start-up. With --spawn-thread the spawner's thread writes them.
func TestAgentBinaryLimits(t *testing.T) {
	for _, inEnv := range []bool{false, true} {
		t.Run(map[bool]string{false: "file", true: "env"}[inEnv], func(t *testing.T) {
			inBothModes(t, func(t *testing.T, _ bool, args []string) { testAgentLimits(t, args, inEnv) })
		})
	}
}

func testAgentLimits(t *testing.T, args []string, inEnv bool) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "pids.max"), filepath.Join(dir, "memory.limit_in_bytes")
	for _, f := range []string{a, b} {
		if err := os.WriteFile(f, []byte("max"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	limits := func(content string) string {
		n++
		if inEnv {
			name := "CORRAL_TEST_LIMITS_" + strconv.Itoa(n)
			t.Setenv(name, content)
			return "--limits-env=" + name
		}
		f := filepath.Join(dir, "limits"+strconv.Itoa(n))
		if err := os.WriteFile(f, []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
		return "--limits=" + f
	}
	p := startAgentBinary(t, testutil.AgentBinary(t), nil, append(args, limits(a+"=128\n"+b+"=268435456\n"))...)
	if p.ready != "ok\n" {
		t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
	}
	for f, want := range map[string]string{a: "128", b: "268435456"} {
		if got, err := os.ReadFile(f); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %s", f, got, err, want)
		}
	}
	p.stop(t)

	bad := map[string]string{
		"unwritable file": limits(filepath.Join(dir, "no", "such") + "=1\n"),
		"relative file":   limits("pids.max=1\n"),
		"no value":        limits(a + "\n"),
	}
	if !inEnv {
		bad["no limits file"] = "--limits=" + filepath.Join(dir, "missing")
	}
	for name, arg := range bad {
		p := startAgentBinary(t, testutil.AgentBinary(t), nil, append(args, arg)...)
		if !strings.HasPrefix(p.ready, "error: ") {
			t.Errorf("%s: ready fd said %q, want an error", name, p.ready)
		}
		if code := p.failedExit(t); code != 1 {
			t.Errorf("%s: exit code %d, want 1", name, code)
		}
	}
}

// With --rlimit the agent lowers its own limits before it serves, and the
// processes it starts inherit them, the Go runtime's NOFILE adjustment
// included; a limit it does not know stops the start-up.
func TestAgentBinaryRlimits(t *testing.T) {
	args := []string{"--listen-fd=4", "--ready-fd=3", "--rlimit=RLIMIT_NOFILE=512", "--rlimit=RLIMIT_CORE=0"}
	p := startAgentBinary(t, testutil.AgentBinary(t), nil, args...)
	if p.ready != "ok\n" {
		t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
	}
	res, err := runExec(t.Context(), p.client, wire.ExecRequest{Shell: "ulimit -n; ulimit -Hn; ulimit -c"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.stdout); res.code() != 0 || got != "512\n512\n0\n" {
		t.Fatalf("limits in a process: %q (code %d, stderr %q), want 512, 512, 0", got, res.code(), res.stderr)
	}
	p.stop(t)

	for _, arg := range []string{"--rlimit=RLIMIT_BOGUS=1", "--rlimit=RLIMIT_NOFILE=many", "--rlimit=RLIMIT_NOFILE"} {
		cmd := exec.Command(testutil.AgentBinary(t), "agent", "--listen-fd=4", arg)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%s: %v, want exit code 2; output:\n%s", arg, err, out)
		}
	}
}

// As PID 1 of fresh PID and network namespaces the agent brings up
// loopback, reaps orphans, and still reports each exec's status.
func TestAgentBinaryAsInit(t *testing.T) {
	testutil.RequiresRoot(t)
	p := startAgentBinary(t, testutil.AgentBinary(t), &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET})
	if p.ready != "ok\n" {
		t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
	}
	ctx := t.Context()
	for _, tt := range []struct {
		name string
		req  wire.ExecRequest
		want string
		code int
	}{
		{"exit code", wire.ExecRequest{Shell: "exit 9"}, "", 9},
		{"agent is pid 1", wire.ExecRequest{Shell: "echo $PPID"}, "1\n", 0},
		// With lo down, connecting to localhost is "unreachable"; with it
		// up, the closed port refuses.
		{"loopback up", wire.ExecRequest{Shell: "bash -c ': </dev/tcp/127.0.0.1/1' 2>&1 | grep -q refused && echo up"}, "up\n", 0},
		{"orphan", wire.ExecRequest{Shell: "sleep 0.1 & echo started"}, "started\n", 0},
	} {
		res, err := runExec(ctx, p.client, tt.req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if string(res.stdout) != tt.want || res.code() != tt.code {
			t.Fatalf("%s: stdout %q stderr %q code %d, want %q and %d", tt.name, res.stdout, res.stderr, res.code(), tt.want, tt.code)
		}
	}
	// The orphaned sleep was re-parented to the agent; once it exits the
	// agent must reap it rather than keep a zombie.
	deadline := time.Now().Add(5 * time.Second)
	for {
		kids := children(p.cmd.Process.Pid)
		if len(kids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var states []string
			for _, k := range kids {
				st, _ := procState(k)
				states = append(states, strconv.Itoa(k)+":"+st)
			}
			t.Fatalf("agent still has children %v", states)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("agent exit code %d; log:\n%s", code, readLog(p.log))
	}
}

// children lists the child processes of pid (of all its threads).
func children(pid int) []int {
	files, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var out []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, field := range bytes.Fields(b) {
			n, _ := strconv.Atoi(string(field))
			out = append(out, n)
		}
	}
	return out
}
