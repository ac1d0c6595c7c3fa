package drivertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// counterLoop is a background process whose state is in memory: its
// counter i, mirrored into /tmp/c ten times a second. The file is replaced
// at once each time: "echo > /tmp/c" truncates it first, and a read could
// fall in between.
const counterLoop = "i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done"

// checkpointer returns the suite's driver as a driver.Checkpointer and
// skips the case when it is not one (or when the harness cannot copy
// roots), after checking that Capabilities agrees.
func checkpointer(t *testing.T, s *suite) driver.Checkpointer {
	cp, ok := s.d.(driver.Checkpointer)
	if !ok {
		if s.d.Capabilities().Checkpoint {
			t.Fatal("Capabilities().Checkpoint is true but the driver is not a driver.Checkpointer")
		}
		t.Skip("driver does not implement driver.Checkpointer")
	}
	if !s.d.Capabilities().Checkpoint {
		t.Error("driver implements driver.Checkpointer but Capabilities().Checkpoint is false")
	}
	if s.h.CopyRootFS == nil {
		t.Skip("harness cannot copy root file systems (Harness.CopyRootFS)")
	}
	return cp
}

// counter reads the counter that counterLoop keeps in sandbox id.
func (s *suite) counter(t *testing.T, id string) int {
	t.Helper()
	b, err := s.agent(t, id).readFile(t.Context(), "/tmp/c")
	if err != nil {
		t.Fatalf("reading the counter in %s: %v", id, err)
	}
	var n int
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		t.Fatalf("counter in %s is %q", id, b)
	}
	return n
}

func testCheckpointRestore(t *testing.T, s *suite) {
	cp := checkpointer(t, s)
	ctx := t.Context()
	orig := s.newID("ckpt")
	root := s.rootfs(t)
	r := driver.Resources{MemoryBytes: 256 << 20, Pids: 128}
	if err := s.d.Create(ctx, driver.Spec{ID: orig, RootFS: root, Hostname: "ckpt", Resources: r}); err != nil {
		t.Fatalf("Create(%s): %v", orig, err)
	}
	a := s.agent(t, orig)
	if err := a.writeFile(ctx, "/root/before", []byte("written before")); err != nil {
		t.Fatal(err)
	}
	proc, err := a.c.StartProcess(ctx, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: counterLoop}})
	if err != nil {
		t.Fatalf("starting the counter: %v", err)
	}
	time.Sleep(time.Second)
	atCheckpoint := s.counter(t, orig)

	image := t.TempDir()
	t0 := time.Now()
	if err := cp.Checkpoint(ctx, orig, image, true); err != nil {
		t.Fatalf("Checkpoint(%s): %v", orig, err)
	}
	checkpointed := time.Since(t0)
	s.wantStatus(t, orig, driver.StatusRunning)
	// Two copies, each from its own copy of the root.
	copies := []string{s.newID("copy1"), s.newID("copy2")}
	var restores []time.Duration
	for _, id := range copies {
		croot := s.h.CopyRootFS(t, root)
		s.mu.Lock()
		s.rootfss = append(s.rootfss, croot)
		s.mu.Unlock()
		t1 := time.Now()
		if err := cp.Restore(ctx, id, driver.Spec{RootFS: croot, Hostname: id, Resources: r}, image); err != nil {
			t.Fatalf("Restore(%s): %v", id, err)
		}
		restores = append(restores, time.Since(t1))
		s.wantStatus(t, id, driver.StatusRunning)
	}
	t.Logf("checkpoint (leave running) %v, restores %v", checkpointed, restores)
	for _, id := range append([]string{orig}, copies...) {
		if n := s.counter(t, id); n < atCheckpoint {
			t.Errorf("counter in %s = %d, want it to continue from %d", id, n, atCheckpoint)
		}
		if b, err := s.agent(t, id).readFile(ctx, "/root/before"); err != nil || string(b) != "written before" {
			t.Errorf("file written before the checkpoint in %s: %q, %v", id, b, err)
		}
		// The counter is the same process, with the same PID, everywhere.
		if p, err := s.agent(t, id).c.Process(ctx, proc.PID); err != nil || !p.Running {
			t.Errorf("counter process %d in %s: %+v, %v", proc.PID, id, p, err)
		}
	}
	checkDiverge(t, s, orig, copies, proc.PID)
	// Without leaveRunning the original stops.
	if err := cp.Checkpoint(ctx, orig, t.TempDir(), false); err != nil {
		t.Fatalf("Checkpoint(%s) without leaving it running: %v", orig, err)
	}
	s.wantStatus(t, orig, driver.StatusStopped)
}

// checkDiverge checks that two copies restored from orig's checkpoint
// diverge: stopping the counter (process pid) in one leaves the other
// counting, and a file written in one is in no other.
func checkDiverge(t *testing.T, s *suite, orig string, copies []string, pid int) {
	ctx := t.Context()
	if err := s.agent(t, copies[0]).c.Signal(ctx, pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.agent(t, copies[0]).c.Wait(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if err := s.agent(t, copies[1]).writeFile(ctx, "/root/mine", []byte(copies[1])); err != nil {
		t.Fatal(err)
	}
	stopped, running := s.counter(t, copies[0]), s.counter(t, copies[1])
	time.Sleep(500 * time.Millisecond)
	if n := s.counter(t, copies[0]); n != stopped {
		t.Errorf("counter in %s moved from %d to %d after it was killed there", copies[0], stopped, n)
	}
	if n := s.counter(t, copies[1]); n <= running {
		t.Errorf("counter in %s stayed at %d after it was killed in %s", copies[1], n, copies[0])
	}
	for _, id := range []string{orig, copies[0]} {
		if _, err := s.agent(t, id).readFile(ctx, "/root/mine"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("reading %s's file in %s = %v, want ErrNotFound", copies[1], id, err)
		}
	}
}
