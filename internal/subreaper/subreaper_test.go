package subreaper

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// spawn starts a child that no one waits for, as runc's detached
// container inits are from the daemon's point of view.
func spawn(t *testing.T, script string) int {
	t.Helper()
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{})
	if err != nil {
		t.Fatalf("starting child: %v", err)
	}
	return pid
}

func start(t *testing.T) *Reaper {
	t.Helper()
	r := New(Options{Interval: time.Hour})
	r.Start(t.Context())
	t.Cleanup(func() { r.Close() })
	return r
}

func waitExit(t *testing.T, ch <-chan Exit) Exit {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("exit channel closed without a value")
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the reaper")
	}
	return Exit{}
}

func TestReapsWatchedChild(t *testing.T) {
	r := start(t)
	pid := spawn(t, "sleep 0.2; exit 3")
	e := waitExit(t, r.Watch(pid))
	if e.Err != nil || e.PID != pid || !e.Status.Exited() || e.Status.ExitStatus() != 3 {
		t.Fatalf("got %+v (exit status %d), want pid %d exited 3", e, e.Status.ExitStatus(), pid)
	}
	if n := r.Watching(); n != 0 {
		t.Errorf("Watching() = %d after reap, want 0", n)
	}
}

func TestReapsZombieWatchedLate(t *testing.T) {
	r := start(t)
	pid := spawn(t, "exit 0")
	time.Sleep(100 * time.Millisecond) // let it become a zombie first
	e := waitExit(t, r.Watch(pid))
	if e.Err != nil || !e.Status.Exited() || e.Status.ExitStatus() != 0 {
		t.Fatalf("got %+v, want a clean exit", e)
	}
}

func TestLeavesUnwatchedChildren(t *testing.T) {
	r := start(t)
	other := spawn(t, "exit 5")
	watched := spawn(t, "sleep 0.1")
	cmd := exec.Command("/bin/sh", "-c", "sleep 0.1; exit 4")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.Watch(watched))

	// os/exec still gets its own child's status.
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 {
		t.Errorf("os/exec Wait = %v, want exit status 4", err)
	}
	// The unwatched child is still a zombie for us to reap.
	var ws unix.WaitStatus
	got, err := unix.Wait4(other, &ws, 0, nil)
	if err != nil || got != other || ws.ExitStatus() != 5 {
		t.Errorf("wait4(unwatched) = %d, %v, status %d; want %d, nil, 5", got, err, ws.ExitStatus(), other)
	}
}

func TestNotAChild(t *testing.T) {
	r := start(t)
	e := waitExit(t, r.Watch(1))
	if !errors.Is(e.Err, unix.ECHILD) {
		t.Fatalf("Watch(1) gave %+v, want ECHILD", e)
	}
}

func TestUnwatchClosesChannel(t *testing.T) {
	r := New(Options{}) // not started: nothing reaps
	pid := spawn(t, "exit 0")
	ch := r.Watch(pid)
	r.Unwatch(pid)
	if _, ok := <-ch; ok {
		t.Fatal("channel delivered a value after Unwatch")
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCloseStops(t *testing.T) {
	r := New(Options{Interval: time.Millisecond})
	r.Start(t.Context())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	pid := spawn(t, "exit 0")
	ch := r.Watch(pid)
	time.Sleep(50 * time.Millisecond)
	select {
	case e := <-ch:
		t.Fatalf("closed reaper reaped %+v", e)
	default:
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
}

func TestSetSubreaper(t *testing.T) {
	if err := SetSubreaper(); err != nil {
		t.Fatal(err)
	}
	// PR_GET_CHILD_SUBREAPER stores the flag through a pointer.
	var flag int32
	if _, _, e := unix.Syscall(unix.SYS_PRCTL, unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&flag)), 0); e != 0 {
		t.Fatal(e)
	}
	if flag != 1 {
		t.Fatalf("subreaper flag = %d, want 1", flag)
	}
}
