package agentserver_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// httpServer is a start command serving HTTP on port after a short delay.
func httpServer(t *testing.T, port int) string {
	t.Helper()
	testutil.RequiresBinary(t, "python3")
	return fmt.Sprintf("echo starting; sleep 0.3; exec python3 -m http.server --bind 127.0.0.1 %d", port)
}

func TestServiceReady(t *testing.T) {
	port := freePort(t)
	tests := []struct {
		name  string
		ready func(port int) *wire.ReadyCheck
	}{
		{"port", func(port int) *wire.ReadyCheck { return &wire.ReadyCheck{Port: port} }},
		{"url", func(port int) *wire.ReadyCheck {
			return &wire.ReadyCheck{URL: fmt.Sprintf("http://127.0.0.1:%d/", port)}
		}},
		{"shell", func(port int) *wire.ReadyCheck {
			return &wire.ReadyCheck{Shell: fmt.Sprintf("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", %d))'", port)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startAgent(t)
			st, err := a.client.StartService(t.Context(), wire.ServiceRequest{
				Start: wire.ExecRequest{Shell: httpServer(t, port)},
				Ready: tt.ready(port), ReadyTimeoutMS: 20000,
			})
			if err != nil {
				t.Fatal(err)
			}
			if st.State != wire.ServiceReady || st.ReadyAt == nil || st.PID == 0 {
				t.Fatalf("status = %+v, want ready with a pid", st)
			}
			conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatalf("service is ready but its port is closed: %v", err)
			}
			conn.Close()
			got, err := a.client.Service(t.Context())
			if err != nil || got.State != wire.ServiceReady || got.PID != st.PID {
				t.Fatalf("Service() = %+v, %v; want ready pid %d", got, err, st.PID)
			}
			var info *wire.ProcessInfo
			procs, err := a.client.Processes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for i := range procs {
				if procs[i].PID == st.PID {
					info = &procs[i]
				}
			}
			if info == nil || info.Tag != wire.ServiceTag || !info.Background {
				t.Fatalf("service process in list = %+v, want tagged %q", info, wire.ServiceTag)
			}
			var out strings.Builder
			err = a.client.ProcessOutput(t.Context(), st.PID, 0, false, func(ev wire.ExecEvent) error {
				out.Write(ev.Bytes())
				return nil
			})
			if err != nil || !strings.Contains(out.String(), "starting") {
				t.Fatalf("output = %q, %v; want it to hold %q", out.String(), err, "starting")
			}
		})
	}
}

func TestServiceNoCheck(t *testing.T) {
	a := startAgent(t)
	st, err := a.client.StartService(t.Context(), wire.ServiceRequest{
		Start: wire.ExecRequest{Shell: "sleep 60", Env: map[string]string{"X": "1"}},
	})
	if err != nil || st.State != wire.ServiceReady {
		t.Fatalf("StartService = %+v, %v; want ready", st, err)
	}
	_, err = a.client.StartService(t.Context(), wire.ServiceRequest{Start: wire.ExecRequest{Shell: "sleep 60"}})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second StartService: %v, want already exists", err)
	}
}

func TestServiceNotFound(t *testing.T) {
	a := startAgent(t)
	if _, err := a.client.Service(t.Context()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Service() without one: %v, want not found", err)
	}
}

func TestServiceNeverReady(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	_, err := a.client.StartService(t.Context(), wire.ServiceRequest{
		Start: wire.ExecRequest{Shell: "echo still-booting-é; exec sleep 60"},
		Ready: &wire.ReadyCheck{Shell: "exit 1", IntervalMS: 20}, ReadyTimeoutMS: 300,
	})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "still-booting-é") {
		t.Fatalf("StartService: %v, want failed precondition with the output", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("returned after %s, before the timeout", d)
	}
	st, err := a.client.Service(t.Context())
	if err != nil || st.State != wire.ServiceFailed || !strings.Contains(st.Output, "still-booting") {
		t.Fatalf("Service() = %+v, %v; want failed with output", st, err)
	}
	if state, ok := procState(st.PID); !ok || state == "Z" {
		t.Fatalf("service process %d no longer runs after the failed wait", st.PID)
	}
}

func TestServiceExitsAtOnce(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	_, err := a.client.StartService(t.Context(), wire.ServiceRequest{
		Start: wire.ExecRequest{Shell: "echo no config >&2; exit 3"},
		Ready: &wire.ReadyCheck{Port: freePort(t)}, ReadyTimeoutMS: 30000,
	})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "code 3") ||
		!strings.Contains(err.Error(), "no config") {
		t.Fatalf("StartService: %v, want failed precondition with code 3 and the output", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %s: did not fail fast", d)
	}
	st, err := a.client.Service(t.Context())
	if err != nil || st.State != wire.ServiceExited || st.ExitCode == nil || *st.ExitCode != 3 {
		t.Fatalf("Service() = %+v, %v; want exited with code 3", st, err)
	}
}

// waitRestarts waits until the service restarted at least n times.
func waitRestarts(t *testing.T, a *testAgent, n int) wire.ServiceStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := a.client.Service(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Restarts >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("service restarted %d times, want %d: %+v", st.Restarts, n, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServiceRestart(t *testing.T) {
	tests := []struct {
		name, restart, shell string
		restarts             bool
	}{
		{"on-failure fails", wire.RestartOnFailure, "sleep 0.05; exit 2", true},
		{"on-failure succeeds", wire.RestartOnFailure, "sleep 0.05; exit 0", false},
		{"always", wire.RestartAlways, "sleep 0.05; exit 0", true},
		{"never", wire.RestartNever, "sleep 0.05; exit 2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startAgent(t)
			first, err := a.client.StartService(t.Context(), wire.ServiceRequest{
				Start: wire.ExecRequest{Shell: tt.shell}, Restart: tt.restart,
			})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.restarts {
				if _, err := a.client.Wait(t.Context(), first.PID); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // past the first backoff
				st, err := a.client.Service(t.Context())
				if err != nil || st.Restarts != 0 || st.State != wire.ServiceExited {
					t.Fatalf("Service() = %+v, %v; want exited without restarts", st, err)
				}
				return
			}
			st := waitRestarts(t, a, 2)
			if st.PID == first.PID {
				t.Fatalf("restarted service kept pid %d", st.PID)
			}
			if st.State != wire.ServiceReady {
				t.Fatalf("state after restarts = %q, want ready", st.State)
			}
		})
	}
}

func TestServiceInvalid(t *testing.T) {
	tests := []struct {
		name string
		req  wire.ServiceRequest
		kind error
	}{
		{"no command", wire.ServiceRequest{}, errdefs.ErrInvalidArgument},
		{"bad restart", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"}, Restart: "sometimes"}, errdefs.ErrInvalidArgument},
		{"two checks", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"},
			Ready: &wire.ReadyCheck{Port: 80, Shell: "true"}}, errdefs.ErrInvalidArgument},
		{"empty check", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"}, Ready: &wire.ReadyCheck{}}, errdefs.ErrInvalidArgument},
		{"bad port", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"}, Ready: &wire.ReadyCheck{Port: 70000}}, errdefs.ErrInvalidArgument},
		{"bad url", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"}, Ready: &wire.ReadyCheck{URL: "ftp://x/"}}, errdefs.ErrInvalidArgument},
		{"negative timeout", wire.ServiceRequest{Start: wire.ExecRequest{Shell: "true"}, ReadyTimeoutMS: -1}, errdefs.ErrInvalidArgument},
		{"missing executable", wire.ServiceRequest{Start: wire.ExecRequest{Cmd: []string{"no-such-command-x"}}}, errdefs.ErrNotFound},
	}
	a := startAgent(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := a.client.StartService(t.Context(), tt.req); !errors.Is(err, tt.kind) {
				t.Fatalf("StartService: %v, want %v", err, tt.kind)
			}
		})
	}
	if _, err := a.client.Service(t.Context()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused request left a service: %v", err)
	}
}

// TestServiceCloseStopsSupervisor closes the agent while the supervisor
// waits to restart; goleak in TestMain checks that nothing is left.
func TestServiceCloseStopsSupervisor(t *testing.T) {
	a := startAgent(t)
	if _, err := a.client.StartService(t.Context(), wire.ServiceRequest{
		Start: wire.ExecRequest{Shell: "exit 1"}, Restart: wire.RestartAlways,
	}); err != nil {
		t.Fatal(err)
	}
	waitRestarts(t, a, 1)
	done := make(chan struct{})
	go func() { a.srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
}

// TestServiceEnvAndCwd checks that the start command and the ready
// command both run with the request's environment and directory.
func TestServiceEnvAndCwd(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	st, err := a.client.StartService(t.Context(), wire.ServiceRequest{
		Start: wire.ExecRequest{Shell: `echo "$GREETING" > marker; exec sleep 60`, Cwd: dir,
			Env: map[string]string{"GREETING": "hello"}},
		Ready:          &wire.ReadyCheck{Cmd: []string{"sh", "-c", `test "$(cat marker)" = "$GREETING"`}, IntervalMS: 20},
		ReadyTimeoutMS: 10000,
	})
	if err != nil || st.State != wire.ServiceReady {
		t.Fatalf("StartService = %+v, %v; want ready", st, err)
	}
}
