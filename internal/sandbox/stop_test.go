package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Detach makes fakeMounter a MountDetacher: the mounts go, the record of
// what was detached stays for the test.
func (f *fakeMounter) Detach(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.prepared, id)
	return nil
}

// writeRoot writes want to /mine in sandbox id's root.
func writeRoot(t *testing.T, h *harness, id, want string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.storage.RootPath(id), "mine"), []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readRoot checks, through the running sandbox's agent, that /mine holds
// want.
func readRoot(t *testing.T, h *harness, id, want string) {
	t.Helper()
	ag, err := h.m.Agent(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := ag.ReadFile(t.Context(), "/mine")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || string(b) != want {
		t.Fatalf("/mine holds %q, %v; want %q", b, err, want)
	}
}

// mustStop stops sandbox id and checks that nothing of it runs or holds
// admission.
func (h *harness) mustStop(t *testing.T, id string) Sandbox {
	t.Helper()
	sb, err := h.m.Stop(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	h.checkStopped(t, id)
	return sb
}

func (h *harness) checkStopped(t *testing.T, id string) {
	t.Helper()
	if got, err := h.m.Get(context.Background(), id); err != nil || got.State != StateStopped || !got.Deadline.IsZero() {
		t.Fatalf("after stop: %+v, %v; want stopped without deadline", got, err)
	}
	if rec := h.store.sandbox(id); rec.State != StateStopped {
		t.Fatalf("stored state %s, want stopped", rec.State)
	}
	if ids, _ := h.drv.List(t.Context()); len(ids) != 0 {
		t.Fatalf("instances left while stopped: %v", ids)
	}
	if n, mem, cpu, _ := h.m.adm.Usage(); n != 0 || mem != 0 || cpu != 0 {
		t.Fatalf("admission holds %d sandboxes, %d bytes, %d millicpus while stopped", n, mem, cpu)
	}
}

func TestStopStart(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Env: map[string]string{"A": "kept"}, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	writeRoot(t, h, sb.ID, "data")
	stopped := h.mustStop(t, sb.ID)
	if stopped.Metadata["k"] != "v" || stopped.Env["A"] != "kept" {
		t.Fatalf("stop lost the record: %+v", stopped)
	}
	if again, err := h.m.Stop(ctx, sb.ID); err != nil || again.State != StateStopped {
		t.Fatalf("second stop = %+v, %v; want the stopped sandbox", again, err)
	}
	started, err := h.m.StartSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if started.ID != sb.ID || started.State != StateRunning || started.Deadline.IsZero() {
		t.Fatalf("started %+v", started)
	}
	if out := execOut(t, h, sb.ID, wire.ExecRequest{Shell: "echo $A"}); out != "kept\n" {
		t.Fatalf("after start: %q; want the env", out)
	}
	readRoot(t, h, sb.ID, "data")
	if n, _, _, _ := h.m.adm.Usage(); n != 1 {
		t.Fatalf("admission holds %d sandboxes after start, want 1", n)
	}
	if again, err := h.m.StartSandbox(ctx, sb.ID); err != nil || again.State != StateRunning {
		t.Fatalf("start of a running sandbox = %+v, %v", again, err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestStoppedRefusesOperations checks that what needs processes says the
// sandbox is stopped, and that delete works.
func TestStoppedRefusesOperations(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SnapshotDir = t.TempDir() })
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	ops := map[string]func() error{
		"exec": func() error {
			return h.m.Exec(ctx, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil })
		},
		"files":    func() error { _, err := h.m.Agent(context.Background(), sb.ID); return err },
		"pause":    func() error { _, err := h.m.Pause(ctx, sb.ID); return err },
		"resume":   func() error { _, err := h.m.Resume(ctx, sb.ID); return err },
		"snapshot": func() error { _, err := h.m.Snapshot(ctx, sb.ID, SnapshotSpec{Name: "s"}); return err },
		"fork":     func() error { _, err := h.m.Fork(ctx, sb.ID, 1); return err },
		"stats":    func() error { _, err := h.m.Stats(ctx, sb.ID); return err },
		"timeout":  func() error { _, err := h.m.SetTimeout(ctx, sb.ID, time.Minute); return err },
	}
	for name, op := range ops {
		err := op()
		if !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("%s of a stopped sandbox = %v, want failed_precondition", name, err)
		}
		if name != "resume" && name != "fork" && name != "snapshot" && (err == nil || !strings.Contains(err.Error(), "stopped")) {
			t.Errorf("%s: %v does not say the sandbox is stopped", name, err)
		}
	}
	h.checkStopped(t, sb.ID)
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestStopPaused(t *testing.T) {
	h := newHarness(t, nil)
	sb, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	if _, err := h.m.StartSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	execOut(t, h, sb.ID, wire.ExecRequest{Shell: "true"})
}

// TestFailedStartStaysStopped checks that a start whose instance fails
// undoes what it made and leaves the sandbox stopped, startable later.
func TestFailedStartStaysStopped(t *testing.T) {
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work", Mode: MountCopyOnWrite}}})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	if fm.live() != 0 || len(fm.released) != 0 {
		t.Fatalf("stop: mounts prepared %v, released %v; want detached, never released", fm.prepared, fm.released)
	}
	boom := errors.New("runtime broke")
	h.setFailDriver(func(string) error { return boom })
	if _, err := h.m.StartSandbox(ctx, sb.ID); !errors.Is(err, boom) {
		t.Fatalf("start with a failing runtime = %v, want %v", err, boom)
	}
	h.checkStopped(t, sb.ID)
	if fm.live() != 0 {
		t.Fatalf("a failed start left mounts %v", fm.prepared)
	}
	h.setFailDriver(nil)
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if fm.live() != 1 {
		t.Fatalf("start prepared %d mounts, want 1", fm.live())
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestStartAdmission checks that a stopped sandbox frees its place and
// that its start is admitted like a create.
func TestStartAdmission(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission = admission.Config{MaxSandboxes: 1} })
	ctx := t.Context()
	a, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, a.ID)
	b, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatalf("create while the only other sandbox is stopped: %v", err)
	}
	if _, err := h.m.StartSandbox(ctx, a.ID); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("start on a full server = %v, want busy", err)
	}
	if got, _ := h.m.Get(context.Background(), a.ID); got.State != StateStopped {
		t.Fatalf("refused start left %s", got.State)
	}
	if err := h.m.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.StartSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
}

// TestStoppedSurvivesRestart checks that a restart keeps a stopped
// sandbox stopped, without a claim, and that it starts afterwards.
func TestStoppedSurvivesRestart(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	writeRoot(t, h, sb.ID, "x")
	h.mustStop(t, sb.ID)
	h.m.Close()
	h.start(t)
	h.checkStopped(t, sb.ID)
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	readRoot(t, h, sb.ID, "x")
}

// TestInterruptedStopOrStartEndsStopped checks what a restart makes of a
// sandbox whose daemon died while stopping or starting it, with its
// instance still there.
func TestInterruptedStopOrStartEndsStopped(t *testing.T) {
	for _, st := range []State{StateStopping, StateStarting} {
		t.Run(st.String(), func(t *testing.T) {
			fm := newFakeMounter()
			h := newHarness(t, func(c *Config) { c.Mounter = fm })
			sb, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work", Mode: MountReadOnly}}})
			if err != nil {
				t.Fatal(err)
			}
			sb.State = st
			if err := h.store.PutSandbox(t.Context(), sb); err != nil {
				t.Fatal(err)
			}
			h.m.Close()
			h.start(t)
			h.checkStopped(t, sb.ID)
			if fm.live() != 0 {
				t.Fatalf("mounts left after the restart: %v", fm.prepared)
			}
			if _, err := h.m.StartSandbox(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUpdateStoppedRecordsLimits checks that new limits of a stopped
// sandbox are kept for its next start.
func TestUpdateStoppedRecordsLimits(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	up, err := h.m.Update(ctx, sb.ID, Update{Limits: Limits{MemoryBytes: 512 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if up.MemoryBytes != 512<<20 || up.State != StateStopped {
		t.Fatalf("updated %+v", up)
	}
	h.checkStopped(t, sb.ID)
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := h.drv.Resources(sb.ID); err != nil || r.MemoryBytes != 512<<20 {
		t.Fatalf("started with %+v, %v; want the new memory limit", r, err)
	}
	if _, mem, _, _ := h.m.adm.Usage(); mem != 512<<20 {
		t.Fatalf("admission counts %d bytes, want the new limit", mem)
	}
}

func TestIdleStop(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", IdleTimeout: time.Minute, OnIdle: ActionStop, OnDeadline: ActionStop, Timeout: ptr(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if sb.OnIdle != ActionStop || sb.OnDeadline != ActionStop {
		t.Fatalf("actions %s/%s", sb.OnIdle, sb.OnDeadline)
	}
	h.m.reapExpired() // starts the idle clock
	h.now.Add(2 * time.Minute)
	h.m.reapExpired()
	h.checkStopped(t, sb.ID)
	h.now.Add(2 * time.Hour) // neither timer fires for a stopped sandbox
	h.m.reapExpired()
	h.checkStopped(t, sb.ID)

	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.now.Add(6 * time.Minute) // past the default timeout of the start
	h.m.reapExpired()
	h.checkStopped(t, sb.ID)
}

// TestStoppedWithMissingRuntime checks that a stopped sandbox whose
// runtime this daemon lacks stays stopped across a restart, and that its
// start names the runtime.
func TestStoppedWithMissingRuntime(t *testing.T) {
	h := newHarness(t, nil)
	sb, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	rec := h.store.sandbox(sb.ID)
	rec.Runtime = "gone"
	if err := h.store.PutSandbox(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.start(t)
	h.checkStopped(t, sb.ID)
	if _, err := h.m.StartSandbox(t.Context(), sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("start without the runtime = %v, want failed_precondition naming it", err)
	}
	if err := h.m.Delete(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestStopStartWhenTheStoreFails checks that a stop or a start whose first
// record cannot be written changes nothing, and that a start whose last
// record fails leaves the sandbox stopped.
func TestStopStartWhenTheStoreFails(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	failAt := func(st State) {
		h.store.mu.Lock()
		h.store.failPut = func(sb Sandbox) error {
			if sb.State == st {
				return boom
			}
			return nil
		}
		h.store.mu.Unlock()
	}
	failAt(StateStopping)
	if _, err := h.m.Stop(ctx, sb.ID); !errors.Is(err, boom) {
		t.Fatalf("stop with a failing store = %v", err)
	}
	if got, _ := h.m.Get(context.Background(), sb.ID); got.State != StateRunning {
		t.Fatalf("after a failed stop: %s, want running", got.State)
	}
	failAt(0)
	h.mustStop(t, sb.ID)
	for _, st := range []State{StateStarting, StateRunning} {
		failAt(st)
		if _, err := h.m.StartSandbox(ctx, sb.ID); !errors.Is(err, boom) {
			t.Fatalf("start failing at %s = %v", st, err)
		}
		failAt(0)
		h.checkStopped(t, sb.ID)
	}
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestStoppedKeepsItsVolume checks that a stopped sandbox's volume is in
// use, before and after a restart, so that it cannot be deleted from under
// the start, and that the start mounts it again.
func TestStoppedKeepsItsVolume(t *testing.T) {
	h, fm := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	for _, when := range []string{"stopped", "stopped, after a restart"} {
		if err := h.m.DeleteVolume(ctx, "data"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("%s: deleting the volume = %v, want failed_precondition", when, err)
		}
		if v, err := h.m.Volume(ctx, "data"); err != nil || len(v.InUseBy) != 1 || v.InUseBy[0] != sb.ID {
			t.Fatalf("%s: volume %+v, %v; want it in use by %s", when, v, err, sb.ID)
		}
		h.m.Close()
		h.start(t)
	}
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	fm.mu.Lock()
	src := fm.prepared[sb.ID][0].Source
	fm.mu.Unlock()
	if src != h.storage.VolumePath("data") {
		t.Fatalf("the start mounts %q, want the volume's path", src)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteVolume(ctx, "data"); err != nil {
		t.Fatalf("deleting the volume once its sandbox is gone: %v", err)
	}
}

// TestStartWithoutMounter: a stopped sandbox with mounts, started by a
// Manager that has no Mounter, stays stopped with an error.
func TestStartWithoutMounter(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Mounter = newFakeMounter() })
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work", Mode: MountReadOnly}}})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	h.m.Close()
	h.cfg.Mounter = nil
	h.start(t)
	if _, err := h.m.StartSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("start without a Mounter = %v, want failed_precondition", err)
	}
	h.checkStopped(t, sb.ID)
}
