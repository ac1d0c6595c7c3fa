package agentserver_test

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

func TestStdinStreaming(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("first\n")}, OpenStdin: true})
	f := follow(t, a, info.PID, 0)
	f.waitFor(t, "first\n")

	// Each write arrives while the request body is still open.
	pr, pw := io.Pipe()
	written := make(chan error, 1)
	go func() { written <- a.client.WriteStdin(ctx, info.PID, pr) }()
	for _, line := range []string{"second\n", "third\n"} {
		if _, err := pw.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		f.waitFor(t, line)
	}
	pw.Close()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	// A second writer after the first.
	if err := a.client.WriteStdin(ctx, info.PID, strings.NewReader("fourth\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.client.CloseStdin(ctx, info.PID); err != nil {
		t.Fatal(err)
	}
	final := waitProc(t, a, info.PID)
	<-f.done
	if *final.ExitCode != 0 || f.output() != "first\nsecond\nthird\nfourth\n" || f.err != nil {
		t.Fatalf("exit %+v, output %q, err %v", final, f.output(), f.err)
	}
	if err := a.client.CloseStdin(ctx, info.PID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second CloseStdin: %v, want failed precondition", err)
	}
	if err := a.client.WriteStdin(ctx, info.PID, strings.NewReader("late")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("WriteStdin after exit: %v, want failed precondition", err)
	}
}

func TestStdinErrors(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()

	t.Run("not open", func(t *testing.T) {
		info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"sleep", "60"}}})
		if err := a.client.WriteStdin(ctx, info.PID, strings.NewReader("x")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("WriteStdin: %v, want failed precondition", err)
		}
		if err := a.client.CloseStdin(ctx, info.PID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("CloseStdin: %v, want failed precondition", err)
		}
	})
	// A writer whose body stays open learns when the process exits.
	t.Run("exit while streaming", func(t *testing.T) {
		info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"head", "-n", "1"}}, OpenStdin: true})
		pr, pw := io.Pipe()
		defer pw.Close()
		written := make(chan error, 1)
		go func() { written <- a.client.WriteStdin(ctx, info.PID, pr) }()
		if _, err := pw.Write([]byte("one line\n")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-written:
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("WriteStdin: %v, want failed precondition", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WriteStdin did not return after the process exited")
		}
	})
	t.Run("unknown process", func(t *testing.T) {
		if err := a.client.WriteStdin(ctx, 1<<30, strings.NewReader("x")); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("WriteStdin: %v, want not found", err)
		}
	})
}

func TestSignal(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	tests := []struct {
		signal     string
		wantCode   int
		wantSignal string
	}{
		{"SIGTERM", 143, "SIGTERM"},
		{"TERM", 143, "SIGTERM"},
		{"term", 143, "SIGTERM"},
		{"15", 143, "SIGTERM"},
		{"KILL", 137, "SIGKILL"},
		{"SIGINT", 130, "SIGINT"},
	}
	for _, tt := range tests {
		t.Run(tt.signal, func(t *testing.T) {
			// exec: the signal must reach the command itself, not only sh.
			info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: "exec sleep 60"}})
			if err := a.client.Signal(ctx, info.PID, tt.signal); err != nil {
				t.Fatal(err)
			}
			final := waitProc(t, a, info.PID)
			if final.ExitCode == nil || *final.ExitCode != tt.wantCode || final.Signal != tt.wantSignal {
				t.Fatalf("after %s: %+v", tt.signal, final)
			}
			if err := a.client.Signal(ctx, info.PID, tt.signal); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("signal after exit: %v, want failed precondition", err)
			}
		})
	}

	info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"sleep", "60"}}})
	for _, bad := range []string{"", "NOPE", "0", "65", "-1"} {
		if err := a.client.Signal(ctx, info.PID, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("signal %q: %v, want invalid argument", bad, err)
		}
	}
	// The whole group gets it: a grandchild dies too.
	group := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: "sleep 60 & echo $!; wait"}})
	f := follow(t, a, group.PID, 0)
	f.waitFor(t, "\n")
	grandchild, err := strconv.Atoi(strings.TrimSpace(f.output()))
	if err != nil {
		t.Fatal(err)
	}
	killLater(t, grandchild)
	if err := a.client.Signal(ctx, group.PID, "TERM"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, grandchild)
}
