package agentserver_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testAgent is an agent server in this process, serving on a unix socket,
// and a client connected to it.
type testAgent struct {
	root   string
	sock   string
	srv    *agentserver.Server
	client *agentclient.Client
}

// startAgent runs an agent with Root set to a fresh directory. Everything
// is torn down when the test ends.
func startAgent(t testing.TB) *testAgent {
	t.Helper()
	root := t.TempDir()
	return startAgentWith(t, agentserver.Options{Root: root, Version: "test"})
}

func startAgentWith(t testing.TB, opts agentserver.Options) *testAgent {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := agentserver.NewServer(opts)
	hs := &http.Server{Handler: srv.Handler()}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var d net.Dialer
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) })
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		// Shutdown, unlike Close, waits for connection goroutines, which
		// goleak would otherwise find lingering.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			t.Errorf("shutting down HTTP server: %v", err)
		}
		<-served
	})
	return &testAgent{root: opts.Root, sock: sock, srv: srv, client: c}
}

// shortTempDir returns a temporary directory with a short path: unix socket
// paths are limited to 108 bytes and t.TempDir embeds the test name.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agentd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// execResult is everything one exec stream carried.
type execResult struct {
	pid            int
	stdout, stderr []byte
	binary         bool // some output came as Data rather than Text
	exit           wire.ExecEvent
}

func (r execResult) code() int {
	if r.exit.ExitCode == nil {
		return -1
	}
	return *r.exit.ExitCode
}

func runExec(ctx context.Context, c *agentclient.Client, req wire.ExecRequest) (execResult, error) {
	var res execResult
	err := c.Exec(ctx, req, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStart:
			res.pid = ev.PID
		case wire.EventStdout:
			res.stdout = append(res.stdout, ev.Bytes()...)
			res.binary = res.binary || ev.Data != nil
		case wire.EventStderr:
			res.stderr = append(res.stderr, ev.Bytes()...)
			res.binary = res.binary || ev.Data != nil
		case wire.EventExit:
			res.exit = ev
		}
		return nil
	})
	return res, err
}

// waitGone waits until pid no longer runs: it is gone or a zombie (killed
// grandchildren are re-parented to the machine's init, which may reap them
// late).
func waitGone(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		state, ok := procState(pid)
		if !ok || state == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running (state %s)", pid, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procState returns the state letter of pid from /proc, and false when the
// process does not exist.
func procState(pid int) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+3 > len(s) {
		return "", false
	}
	return s[i+2 : i+3], true
}

// killLater kills pid when the test ends, for processes a test leaves
// behind on purpose.
func killLater(t testing.TB, pid int) {
	t.Cleanup(func() {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("killing %d: %v", pid, err)
		}
	})
}
