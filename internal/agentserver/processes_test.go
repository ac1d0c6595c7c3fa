package agentserver_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// startProc starts a background process that is removed (and killed) when
// the test ends.
func startProc(t *testing.T, a *testAgent, req wire.StartRequest) wire.ProcessInfo {
	t.Helper()
	info, err := a.client.StartProcess(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.client.RemoveProcess(context.Background(), info.PID)
		waitGone(t, info.PID)
	})
	return info
}

// follower follows a process's output in the background.
type follower struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	out    bytes.Buffer
	events []wire.ExecEvent
	err    error
}

func follow(t *testing.T, a *testAgent, pid int, from int64) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	f := &follower{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		err := a.client.ProcessOutput(ctx, pid, from, true, func(ev wire.ExecEvent) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.events = append(f.events, ev)
			f.out.Write(ev.Bytes())
			return nil
		})
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
	}()
	t.Cleanup(f.stop)
	return f
}

func (f *follower) stop() {
	f.cancel()
	<-f.done
}

func (f *follower) output() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.String()
}

// waitFor waits until the output contains s.
func (f *follower) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(f.output(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q does not contain %q", f.output(), s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitProc waits for a process to exit, with a deadline.
func waitProc(t *testing.T, a *testAgent, pid int) wire.ProcessInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	info, err := a.client.Wait(ctx, pid)
	if err != nil {
		t.Fatalf("waiting for %d: %v", pid, err)
	}
	return info
}

// checkLines checks that out is "line 0\nline 1\n..." with nothing missing
// or repeated, and returns the number of lines.
func checkLines(t *testing.T, out string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if l != "line "+strconv.Itoa(i) {
			t.Fatalf("line %d is %q, want %q (output %q)", i, l, "line "+strconv.Itoa(i), out)
		}
	}
	return len(lines)
}

func TestBackgroundReattach(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	info := startProc(t, a, wire.StartRequest{
		ExecRequest: wire.ExecRequest{Shell: `i=0; while true; do echo line $i; i=$((i+1)); sleep 0.05; done`},
		Tag:         "lines",
	})
	pid := info.PID
	if !info.Running || !info.Background || info.Tag != "lines" || info.PTY {
		t.Fatalf("start info = %+v", info)
	}

	// Let some lines pass unobserved: the first attach replays them.
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := a.client.Process(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		if info.OutputBytes >= 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}

	var got bytes.Buffer
	var next int64
	// attach follows from next until the output has at least lines lines
	// (then leaves), or until the exit event.
	attach := func(lines int) (exited bool) {
		t.Helper()
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		sawStart := false
		err := a.client.ProcessOutput(actx, pid, next, true, func(ev wire.ExecEvent) error {
			switch ev.Type {
			case wire.EventStart:
				sawStart = true
				if ev.PID != pid || ev.Dropped != 0 {
					return fmt.Errorf("start event %+v", ev)
				}
			case wire.EventStdout:
				if ev.Offset != next || ev.Dropped != 0 {
					return fmt.Errorf("chunk at offset %d (dropped %d), want %d", ev.Offset, ev.Dropped, next)
				}
				got.Write(ev.Bytes())
				next += int64(len(ev.Bytes()))
				if bytes.Count(got.Bytes(), []byte("\n")) >= lines {
					cancel()
				}
			case wire.EventExit:
				exited = true
			default:
				return fmt.Errorf("unexpected event %+v", ev)
			}
			return nil
		})
		if !sawStart {
			t.Fatalf("no start event (%v)", err)
		}
		if exited && err == nil {
			return true
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ProcessOutput: %v", err)
		}
		return false
	}
	attach(5)
	first := checkLines(t, got.String())
	attach(first + 5)
	if n := checkLines(t, got.String()); n < first+5 {
		t.Fatalf("second attach ended at %d lines", n)
	}

	if err := a.client.Signal(ctx, pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	final := waitProc(t, a, pid)
	if final.Running || final.ExitCode == nil || *final.ExitCode != 143 || final.Signal != "SIGTERM" || final.ExitedAt == nil {
		t.Fatalf("after TERM: %+v", final)
	}
	// The rest, then the exit event.
	if !attach(1 << 30) {
		t.Fatal("re-attach after exit did not end with the exit event")
	}
	checkLines(t, got.String())
	if final.OutputBytes != next {
		t.Fatalf("OutputBytes = %d, read %d", final.OutputBytes, next)
	}

	// A full replay without follow matches, and ends with the exit.
	var replay bytes.Buffer
	var last wire.ExecEvent
	if err := a.client.ProcessOutput(ctx, pid, 0, false, func(ev wire.ExecEvent) error {
		replay.Write(ev.Bytes())
		last = ev
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if replay.String() != got.String() || last.Type != wire.EventExit || *last.ExitCode != 143 {
		t.Fatalf("replay %q, last %+v; want %q and exit", replay.String(), last, got.String())
	}

	if err := a.client.RemoveProcess(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.Process(ctx, pid); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Process after remove: %v, want not found", err)
	}
	list, err := a.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(list, func(p wire.ProcessInfo) bool { return p.PID == pid }) {
		t.Fatalf("removed process still listed: %+v", list)
	}
}

// A follower that stops reading blocks neither the process nor another
// follower; a follower that falls behind the buffer skips ahead and is
// told how much it missed.
func TestSlowFollowerDoesNotBlock(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	const size = 4_000_000
	info := startProc(t, a, wire.StartRequest{
		ExecRequest: wire.ExecRequest{Shell: "read go; head -c " + strconv.Itoa(size) + " /dev/zero; echo done"},
		OpenStdin:   true,
	})

	// The stalled follower reads its response header and start event,
	// then never reads again.
	conn, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /processes/%d/output?from=0&follow=true HTTP/1.1\r\nHost: agent\r\n\r\n", info.PID)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"type":"start"`) {
			break
		}
	}

	var total, dropped, next int64
	var exit *wire.ExecEvent
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	outputDone := make(chan error, 1)
	go func() {
		outputDone <- a.client.ProcessOutput(fctx, info.PID, 0, true, func(ev wire.ExecEvent) error {
			switch ev.Type {
			case wire.EventStdout, wire.EventStderr:
				if ev.Offset != next+ev.Dropped {
					return fmt.Errorf("chunk at %d after %d with %d dropped", ev.Offset, next, ev.Dropped)
				}
				dropped += ev.Dropped
				total += int64(len(ev.Bytes()))
				next = ev.Offset + int64(len(ev.Bytes()))
			case wire.EventExit:
				exit = &ev
			}
			return nil
		})
	}()
	if err := a.client.WriteStdin(ctx, info.PID, strings.NewReader("go\n")); err != nil {
		t.Fatal(err)
	}
	final := waitProc(t, a, info.PID)
	if *final.ExitCode != 0 || final.OutputBytes != size+5 {
		t.Fatalf("process ended %+v", final)
	}
	if err := <-outputDone; err != nil {
		t.Fatal(err)
	}
	if exit == nil || total+dropped != size+5 {
		t.Fatalf("follower got %d bytes + %d dropped, exit %v; want %d in all", total, dropped, exit, size+5)
	}
	t.Logf("follower read %d bytes, skipped %d", total, dropped)
}

func TestOutputBufferOverflow(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	info := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: "yes abcdefghi | head -c 3000000; printf end"}})
	final := waitProc(t, a, info.PID)
	const total = 3000003
	if final.OutputBytes != total {
		t.Fatalf("OutputBytes = %d", final.OutputBytes)
	}

	tests := []struct {
		name        string
		from        int64
		wantDropped int64
		wantFirst   int64 // offset of the first chunk
		wantLen     int64
		wantSuffix  string
	}{
		{name: "from start", from: 0, wantDropped: total - 1<<20, wantFirst: total - 1<<20, wantLen: 1 << 20, wantSuffix: "i\nend"},
		{name: "near end", from: total - 10, wantFirst: total - 10, wantLen: 10, wantSuffix: "defghi\nend"},
		{name: "at end", from: total, wantLen: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var start, exit wire.ExecEvent
			var data []byte
			first := int64(-1)
			err := a.client.ProcessOutput(ctx, info.PID, tt.from, false, func(ev wire.ExecEvent) error {
				switch ev.Type {
				case wire.EventStart:
					start = ev
				case wire.EventExit:
					exit = ev
				default:
					if first < 0 {
						first = ev.Offset
					}
					data = append(data, ev.Bytes()...)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if start.Dropped != tt.wantDropped || int64(len(data)) != tt.wantLen || exit.Type != wire.EventExit {
				t.Fatalf("dropped %d, %d bytes, exit %+v; want dropped %d, %d bytes", start.Dropped, len(data), exit, tt.wantDropped, tt.wantLen)
			}
			if tt.wantLen > 0 && (first != tt.wantFirst || !strings.HasSuffix(string(data), tt.wantSuffix)) {
				t.Fatalf("first offset %d, ends %q; want %d, %q", first, data[max(0, len(data)-12):], tt.wantFirst, tt.wantSuffix)
			}
		})
	}
	t.Run("beyond end", func(t *testing.T) {
		err := a.client.ProcessOutput(ctx, info.PID, total+1, false, func(wire.ExecEvent) error { return nil })
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err = %v, want invalid argument", err)
		}
	})
}

func TestProcessListAndRemove(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	cwd := t.TempDir()
	bg := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"sleep", "60"}, Cwd: cwd}, Tag: "bg"})
	quick := startProc(t, a, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: "exit 4"}})
	waitProc(t, a, quick.PID)

	// A foreground exec is listed while it runs.
	fgPID := make(chan int, 1)
	release := make(chan struct{})
	execDone := make(chan error, 1)
	go func() {
		execDone <- a.client.Exec(ctx, wire.ExecRequest{Cmd: []string{"sleep", "60"}}, func(ev wire.ExecEvent) error {
			if ev.Type == wire.EventStart {
				fgPID <- ev.PID
				<-release
				return errors.New("done")
			}
			return nil
		})
	}()
	fg := <-fgPID

	list, err := a.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byPID := make(map[int]wire.ProcessInfo)
	for _, p := range list {
		byPID[p.PID] = p
	}
	if p := byPID[bg.PID]; !p.Running || !p.Background || p.Tag != "bg" || p.Cwd != cwd || !slices.Equal(p.Cmd, []string{"sleep", "60"}) || p.StartedAt.IsZero() {
		t.Errorf("background process listed as %+v", p)
	}
	if p := byPID[quick.PID]; p.Running || p.ExitCode == nil || *p.ExitCode != 4 || p.ExitedAt == nil {
		t.Errorf("exited process listed as %+v", p)
	}
	if p, ok := byPID[fg]; !ok || !p.Running || p.Background {
		t.Errorf("foreground exec listed as %+v (%v)", p, ok)
	}
	if err := a.client.ProcessOutput(ctx, fg, 0, false, func(wire.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("output of a foreground exec: %v, want failed precondition", err)
	}
	close(release)
	<-execDone
	waitGone(t, fg)

	// Removing a running process kills it.
	if err := a.client.RemoveProcess(ctx, bg.PID); err != nil {
		t.Fatal(err)
	}
	waitGone(t, bg.PID)
	if err := a.client.RemoveProcess(ctx, bg.PID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second remove: %v, want not found", err)
	}
	for _, op := range []func() error{
		func() error { _, err := a.client.Wait(ctx, bg.PID); return err },
		func() error { return a.client.Signal(ctx, bg.PID, "TERM") },
		func() error { return a.client.Resize(ctx, bg.PID, wire.PTYSize{Cols: 1, Rows: 1}) },
	} {
		if err := op(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("after remove: %v, want not found", err)
		}
	}
}

// Only the newest exited background processes are kept.
func TestKeptExitedLimit(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	const n = 260 // the agent keeps 256
	pids := make([]int, n)
	for i := range n {
		info, err := a.client.StartProcess(ctx, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"true"}}})
		if err != nil {
			t.Fatal(err)
		}
		pids[i] = info.PID
		waitProc(t, a, info.PID)
	}
	list, err := a.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 256 {
		t.Fatalf("%d processes listed, want 256", len(list))
	}
	if _, err := a.client.Process(ctx, pids[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("oldest: %v, want not found", err)
	}
	if _, err := a.client.Process(ctx, pids[n-1]); err != nil {
		t.Fatalf("newest: %v", err)
	}
}

// Close kills background processes too; their followers and waiters get
// the exit.
func TestCloseKillsBackground(t *testing.T) {
	a := startAgent(t)
	info, err := a.client.StartProcess(t.Context(), wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: "echo up; exec sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	f := follow(t, a, info.PID, 0)
	f.waitFor(t, "up\n")
	waited := make(chan wire.ProcessInfo, 1)
	go func() {
		final, _ := a.client.Wait(t.Context(), info.PID)
		waited <- final
	}()
	if err := a.srv.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, info.PID)
	final := <-waited
	<-f.done
	if final.Signal != "SIGKILL" || f.err != nil || f.events[len(f.events)-1].Type != wire.EventExit {
		t.Fatalf("wait %+v, follower err %v, events %+v", final, f.err, f.events)
	}
	if _, err := a.client.StartProcess(t.Context(), wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"true"}}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("start after Close: %v, want unavailable", err)
	}
}
