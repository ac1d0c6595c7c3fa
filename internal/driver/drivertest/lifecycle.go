package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

func testLifecycle(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.create(t, "life", driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 1000, Pids: 256})
	s.wantStatus(t, id, driver.StatusRunning)

	h, err := s.agent(t, id).health(ctx)
	if err != nil || !h.OK {
		t.Fatalf("agent health = %+v, %v; want ok", h, err)
	}
	res := s.sh(t, id, "echo hi")
	if res.stdout != "hi\n" || res.exitCode != 0 {
		t.Fatalf("echo hi gave stdout %q exit %d, stderr %q", res.stdout, res.exitCode, res.stderr)
	}
	if res := s.sh(t, id, "exit 7"); res.exitCode != 7 {
		t.Errorf("exit 7 reported exit code %d", res.exitCode)
	}
	st, err := s.d.Stats(ctx, id)
	if err != nil {
		t.Fatalf("Stats(%s): %v", id, err)
	}
	if s.h.Features.Limits && (st.MemoryBytes <= 0 || st.CPUUsageNanos <= 0 || st.Pids < 1) {
		t.Errorf("Stats(%s) = %+v; want memory, CPU and pids above zero", id, st)
	}
	ids, err := s.d.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Errorf("List() = %v, %v; want it to contain %s", ids, err, id)
	}

	if err := s.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusUnknown)
	if err := s.d.Delete(ctx, id); err != nil {
		t.Errorf("second Delete(%s) = %v, want nil", id, err)
	}
	if ids, err := s.d.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Errorf("List() after delete = %v, %v; want no %s", ids, err, id)
	}
	if c, err := s.d.DialAgent(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		if c != nil {
			c.Close()
		}
		t.Errorf("DialAgent after delete = %v, want ErrNotFound", err)
	}
	if _, err := s.d.Stats(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stats after delete = %v, want ErrNotFound", err)
	}
	if err := s.d.Delete(ctx, "never-created"); err != nil {
		t.Errorf("Delete of an unknown id = %v, want nil", err)
	}
}

func testCreateDuplicate(t *testing.T, s *suite) {
	id := s.create(t, "dup", driver.Resources{})
	err := s.d.Create(t.Context(), driver.Spec{ID: id, RootFS: s.rootfs(t)})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Create(%s) = %v, want ErrAlreadyExists", id, err)
	}
	// The failed duplicate must not have harmed the original.
	s.wantStatus(t, id, driver.StatusRunning)
	if res := s.sh(t, id, "echo still"); res.stdout != "still\n" {
		t.Errorf("original sandbox after duplicate create: stdout %q", res.stdout)
	}
}

func testFailedCreate(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.newID("fail")
	missing := s.rootfs(t) + "/does-not-exist"
	if err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: missing}); err == nil {
		t.Fatalf("Create with a missing root file system succeeded")
	}
	if ids, err := s.d.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List() after failed create = %v, %v; want empty", ids, err)
	}
	if s.h.CgroupParent != "" {
		if dirs := testutil.CgroupDirs(t, s.h.CgroupParent); len(dirs) != 0 {
			t.Fatalf("cgroups left by failed create: %v", dirs)
		}
	}
	s.wantStatus(t, id, driver.StatusUnknown)
	// Nothing of the failed attempt blocks the ID.
	if err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: s.rootfs(t)}); err != nil {
		t.Fatalf("Create(%s) after a failed create: %v", id, err)
	}
}

func testConcurrentCreates(t *testing.T, s *suite) {
	const n = 5
	ids := make([]string, n)
	specs := make([]driver.Spec, n)
	for i := range ids {
		ids[i] = s.newID(fmt.Sprintf("conc%d", i))
		specs[i] = driver.Spec{ID: ids[i], RootFS: s.rootfs(t), Resources: driver.Resources{MemoryBytes: 64 << 20}}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { errs[i] = s.d.Create(t.Context(), specs[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Create(%s): %v", ids[i], err)
		}
	}
	if t.Failed() {
		return
	}
	for _, id := range ids {
		if res := s.sh(t, id, "hostname"); res.exitCode != 0 {
			t.Errorf("exec in %s: %+v", id, res)
		}
	}
	for i := range ids {
		wg.Go(func() { errs[i] = s.d.Delete(t.Context(), ids[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Delete(%s): %v", ids[i], err)
		}
	}
}

func testPauseResume(t *testing.T, s *suite) {
	p, ok := s.d.(driver.Pauser)
	if !ok {
		if s.d.Capabilities().Pause {
			t.Fatal("Capabilities().Pause is true but the driver is not a driver.Pauser")
		}
		t.Skip("driver does not implement driver.Pauser")
	}
	if !s.d.Capabilities().Pause {
		t.Error("driver implements driver.Pauser but Capabilities().Pause is false")
	}
	ctx := t.Context()
	id := s.create(t, "pause", driver.Resources{})
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusPaused)
	if s.h.Features.Freeze {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.agent(t, id).exec(short, wire.ExecRequest{Shell: "echo frozen"})
		cancel()
		if err == nil {
			t.Errorf("exec in a paused sandbox completed")
		}
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusRunning)
	if res := s.sh(t, id, "echo thawed"); res.stdout != "thawed\n" {
		t.Errorf("exec after resume: stdout %q", res.stdout)
	}
	// Deleting a paused sandbox works too.
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("second Pause(%s): %v", id, err)
	}
	if err := s.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a paused sandbox: %v", err)
	}
	s.wantStatus(t, id, driver.StatusUnknown)
}

// testErrorKinds checks the errdefs kinds of the optional abilities:
// ErrNotFound for an unknown instance, ErrFailedPrecondition for a state
// that does not allow the call.
func testErrorKinds(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.create(t, "kinds", driver.Resources{})
	if p, ok := s.d.(driver.Pauser); ok {
		if err := p.Pause(ctx, "never-created"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Pause(unknown) = %v, want ErrNotFound", err)
		}
		if err := p.Resume(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Resume(running) = %v, want ErrFailedPrecondition", err)
		}
	}
	if u, ok := s.d.(driver.Updater); ok {
		if err := u.Update(ctx, "never-created", driver.Resources{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Update(unknown) = %v, want ErrNotFound", err)
		}
	}
	if c, ok := s.d.(driver.Checkpointer); ok {
		if err := c.Checkpoint(ctx, "never-created", t.TempDir(), true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Checkpoint(unknown) = %v, want ErrNotFound", err)
		}
	}
}
