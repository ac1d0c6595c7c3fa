package agentserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// typeLine writes a line to a PTY process's stdin.
func typeLine(t *testing.T, a *testAgent, pid int, line string) {
	t.Helper()
	if err := a.client.WriteStdin(t.Context(), pid, strings.NewReader(line+"\n")); err != nil {
		t.Fatal(err)
	}
}

func TestPTY(t *testing.T) {
	testutil.RequiresRoot(t) // allocating a terminal needs access to /dev/ptmx and devpts
	a := startAgent(t)
	ctx := t.Context()
	info := startProc(t, a, wire.StartRequest{
		ExecRequest: wire.ExecRequest{Cmd: []string{"/bin/sh"}},
		PTY:         &wire.PTYSize{Cols: 100, Rows: 30},
	})
	if !info.PTY {
		t.Fatalf("info = %+v", info)
	}
	f := follow(t, a, info.PID, 0)

	// Markers are printed by the shell, not echoed by the terminal: the
	// echo shows the command with quotes, the output without.
	typeLine(t, a, info.PID, `stty size; echo "mark""1"`)
	f.waitFor(t, "mark1")
	if !strings.Contains(f.output(), "30 100\r\n") {
		t.Fatalf("stty size before resize: %q", f.output())
	}
	if err := a.client.Resize(ctx, info.PID, wire.PTYSize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	typeLine(t, a, info.PID, `stty size; echo "mark""2"`)
	f.waitFor(t, "mark2")
	if !strings.Contains(f.output(), "40 120\r\n") {
		t.Fatalf("stty size after resize: %q", f.output())
	}
	typeLine(t, a, info.PID, `echo "$TERM"; tty; [ -t 0 ] && [ -t 1 ] && echo "is""tty"`)
	f.waitFor(t, "istty")
	if !strings.Contains(f.output(), "xterm-256color\r\n") {
		t.Fatalf("TERM not set: %q", f.output())
	}
	if !regexp.MustCompile(`/dev/pts/\d+\r\n`).MatchString(f.output()) {
		t.Fatalf("tty: %q", f.output())
	}
	// The terminal is the session's controlling tty: /dev/tty opens.
	typeLine(t, a, info.PID, `echo ctl > /dev/tty && echo "ctl""ok"`)
	f.waitFor(t, "ctlok")

	typeLine(t, a, info.PID, "exit 3")
	final := waitProc(t, a, info.PID)
	if final.ExitCode == nil || *final.ExitCode != 3 {
		t.Fatalf("exit = %+v, want 3", final)
	}
	<-f.done
	if f.err != nil {
		t.Fatal(f.err)
	}
	for _, ev := range f.events {
		if ev.Type == wire.EventStderr {
			t.Fatalf("stderr event from a PTY process: %+v", ev)
		}
	}
	if err := a.client.Resize(ctx, info.PID, wire.PTYSize{Cols: 1, Rows: 1}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("resize after exit: %v, want failed precondition", err)
	}
}

// Without a command, a PTY runs the user's login shell from the sandbox's
// passwd as a login shell.
func TestPTYDefaultShell(t *testing.T) {
	testutil.RequiresRoot(t)
	tests := []struct {
		name   string
		passwd string
		want   string
	}{
		{name: "passwd shell", passwd: "root:x:0:0:root:/root:/bin/bash\n", want: "-bash"},
		{name: "missing shell falls back", passwd: "root:x:0:0:root:/root:/no/such/shell\n", want: "-sh"},
		{name: "no passwd entry", passwd: "", want: "-sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Contains(tt.passwd, "/bin/bash") {
				testutil.RequiresBinary(t, "/bin/bash")
			}
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(tt.passwd), 0o644); err != nil {
				t.Fatal(err)
			}
			a := startAgentWith(t, agentserver.Options{Root: root})
			info := startProc(t, a, wire.StartRequest{PTY: &wire.PTYSize{Cols: 80, Rows: 24}, ExecRequest: wire.ExecRequest{Env: map[string]string{"TERM": "dumb", "PS1": "$ "}}})
			if len(info.Cmd) != 1 || info.Cmd[0] != tt.want {
				t.Fatalf("cmd = %q, want [%s]", info.Cmd, tt.want)
			}
			f := follow(t, a, info.PID, 0)
			typeLine(t, a, info.PID, `echo "[$0|$TERM]"`)
			f.waitFor(t, "["+tt.want+"|dumb]")
			// ^D at an empty prompt ends the shell. One that arrives while
			// the shell is still busy (a login shell reads its profile)
			// can be lost when line editing switches the terminal's mode,
			// so it is pressed again, as a person would.
			wctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			waited := make(chan error, 1)
			var final wire.ProcessInfo
			go func() {
				var err error
				final, err = a.client.Wait(wctx, info.PID)
				waited <- err
			}()
			var err error
		press:
			for {
				if err := a.client.CloseStdin(t.Context(), info.PID); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatal(err)
				}
				select {
				case err = <-waited:
					break press
				case <-time.After(200 * time.Millisecond):
				}
			}
			if err != nil || final.ExitCode == nil || *final.ExitCode != 0 {
				t.Fatalf("exit after ^D = %+v, output %q", final, f.output())
			}
		})
	}
}

func TestResizeWithoutPTY(t *testing.T) {
	a := startAgent(t)
	info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"sleep", "60"}}})
	if err := a.client.Resize(t.Context(), info.PID, wire.PTYSize{Cols: 80, Rows: 24}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("resize: %v, want failed precondition", err)
	}
}
