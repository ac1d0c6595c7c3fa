package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/wire"
)

// newSnapHarness is a harness whose store keeps snapshots.
func newSnapHarness(t *testing.T) (*harness, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snapshots")
	h := newHarness(t, func(c *Config) {
		c.Store = withSnapshots(c.Store.(*memStore))
		c.SnapshotDir = dir
	})
	return h, dir
}

func writeRootFile(t *testing.T, h *harness, id, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.storage.RootPath(id), name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func rootFile(h *harness, id, name string) string {
	b, err := os.ReadFile(filepath.Join(h.storage.RootPath(id), name))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func TestSnapshotRestoreFiles(t *testing.T) {
	h, _ := newSnapHarness(t)
	ctx := t.Context()
	if got := h.m.Runtimes()[0].Snapshot; got != SnapshotFilesystem {
		t.Fatalf("runtime snapshot kind = %q, want %q", got, SnapshotFilesystem)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 64 << 20, Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	writeRootFile(t, h, src.ID, "before", "1")
	snap, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s1", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Kind != SnapshotFilesystem || snap.Template != "tiny" || snap.MemoryBytes != 64<<20 || snap.Metadata["k"] != "v" {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s1"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second snapshot s1: %v, want already exists", err)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "Bad/Name"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if sb, _ := h.m.Get(context.Background(), src.ID); sb.State != StateRunning {
		t.Fatalf("source is %s after the snapshot", sb.State)
	}
	writeRootFile(t, h, src.ID, "after", "2")
	if err := h.m.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}

	cp, err := h.m.Create(ctx, Spec{FromSnapshot: "s1", Env: map[string]string{"B": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if cp.Template != "tiny" || cp.MemoryBytes != 64<<20 || cp.Env["A"] != "1" || cp.Env["B"] != "2" {
		t.Fatalf("restored %+v", cp)
	}
	got := map[string]string{"before": rootFile(h, cp.ID, "before"), "hello": rootFile(h, cp.ID, "hello"), "after": rootFile(h, cp.ID, "after")}
	want := map[string]string{"before": "1", "hello": "hi", "after": "<open " + filepath.Join(h.storage.RootPath(cp.ID), "after") + ": no such file or directory>"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("restored files (-want +got):\n%s", diff)
	}
	if _, err := h.m.Create(ctx, Spec{FromSnapshot: "s1", Template: "other"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("from snapshot with another template: %v", err)
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("deleting a template a snapshot uses: %v", err)
	}
	if err := h.m.Delete(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(ctx, Spec{FromSnapshot: "s1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("from a deleted snapshot: %v", err)
	}
	h.assertClean(t)
}

func TestSnapshotDamagedFailsClearly(t *testing.T) {
	h, dir := newSnapHarness(t)
	ctx := t.Context()
	src, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	writeRootFile(t, h, src.ID, "data", "precious")
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "s", snapshotdir.ChangesName), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 600); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = h.m.Create(ctx, Spec{FromSnapshot: "s"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("restore of a damaged snapshot: %v", err)
	}
	h.assertClean(t)
}

func TestPauseResume(t *testing.T) {
	h, _ := newSnapHarness(t)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Resume(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("resume of a running sandbox: %v", err)
	}
	p, err := h.m.Pause(ctx, sb.ID)
	if err != nil || p.State != StatePaused {
		t.Fatalf("pause: %v %v", p.State, err)
	}
	if _, err := h.m.Pause(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second pause: %v", err)
	}
	err = h.m.Exec(ctx, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec while paused: %v", err)
	}
	h.now.Add(time.Hour) // past the deadline while paused
	r, err := h.m.ResumeFor(ctx, sb.ID, 90*time.Second)
	if err != nil || r.State != StateRunning {
		t.Fatalf("resume: %v %v", r.State, err)
	}
	if want := h.now.Now().Add(90 * time.Second); !r.Deadline.Equal(want) {
		t.Fatalf("deadline after resume = %v, want %v", r.Deadline, want)
	}
	if rec := h.store.sandbox(sb.ID); rec.State != StateRunning {
		t.Fatalf("stored state %s", rec.State)
	}
}

func TestForkFilesystem(t *testing.T) {
	h, dir := newSnapHarness(t)
	ctx := t.Context()
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	writeRootFile(t, h, src.ID, "state", "42")
	if _, err := h.m.Fork(ctx, src.ID, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("fork 0: %v", err)
	}
	copies, err := h.m.Fork(ctx, src.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 3 {
		t.Fatalf("%d copies", len(copies))
	}
	for _, c := range copies {
		if got := rootFile(h, c.ID, "state"); got != "42" || c.Metadata["team"] != "a" || c.ID == src.ID {
			t.Errorf("copy %s: state %q, %+v", c.ID, got, c)
		}
	}
	writeRootFile(t, h, copies[0].ID, "state", "43")
	if got := rootFile(h, copies[1].ID, "state"); got != "42" {
		t.Errorf("copies share files: %q", got)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("fork left %d entries in the snapshot directory", len(left))
	}
	// A failed copy rolls back the others.
	h.setFailDriver(func(id string) error {
		if id != src.ID {
			return errors.New("boom")
		}
		return nil
	})
	if _, err := h.m.Fork(ctx, src.ID, 2); err == nil {
		t.Fatal("fork with failing creates succeeded")
	}
	if n := len(h.m.List(context.Background(), Filter{})); n != 4 {
		t.Errorf("%d sandboxes after a failed fork, want 4", n)
	}
}

func TestSnapshotReconcile(t *testing.T) {
	h, dir := newSnapHarness(t)
	ctx := t.Context()
	src, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	writeRootFile(t, h, src.ID, "x", "1")
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "kept"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "unrecorded"}); err != nil {
		t.Fatal(err)
	}
	// Crash leftovers: a half-written snapshot, a published one whose
	// record was never written, and a record whose files are gone.
	st := h.cfg.Store.(*snapStore)
	_ = st.DeleteSnapshot(ctx, "unrecorded")
	_ = st.PutSnapshot(ctx, Snapshot{Name: "lost", Template: "tiny", Runtime: "fake"})
	if err := os.MkdirAll(filepath.Join(dir, ".tmp-half-123", "memory"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A frozen instance that the store says runs: an interrupted snapshot.
	if err := h.drv.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.start(t)
	var names []string
	for _, s := range h.m.Snapshots(context.Background()) {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"kept"}, names); diff != "" {
		t.Fatalf("snapshots after restart (-want +got):\n%s", diff)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "kept" {
		t.Fatalf("snapshot directory holds %v", left)
	}
	if sb, _ := h.m.Get(context.Background(), src.ID); sb.State != StateRunning {
		t.Fatalf("sandbox is %s after restart", sb.State)
	}
	if st, _ := h.drv.Status(ctx, src.ID); st != "running" {
		t.Fatalf("instance is %s after restart", st)
	}
	tpl, err := h.m.TemplateFromSnapshot(ctx, "fromsnap", "kept")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := h.m.Create(ctx, Spec{Template: tpl.Name})
	if err != nil {
		t.Fatal(err)
	}
	if got := rootFile(h, sb.ID, "x") + rootFile(h, sb.ID, "hello"); got != "1hi" {
		t.Fatalf("template from snapshot holds %q", got)
	}
}

func TestSnapshotConcurrentRestores(t *testing.T) {
	h, _ := newSnapHarness(t)
	ctx := t.Context()
	src, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := h.m.Create(ctx, Spec{FromSnapshot: "s"})
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent create from one snapshot: %v", err)
		}
	}
	// A delete is refused while a restore uses the snapshot.
	_, _, release, err := h.m.useSnapshot(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteSnapshot(ctx, "s"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("delete during a restore: %v", err)
	}
	release()
	if err := h.m.DeleteSnapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
}

// TestPrivateDiskRuntime checks what a runtime whose writes storage never
// sees (driver.Capabilities.PrivateDisk, the vm runtime) is refused:
// filesystem snapshots and forks, stops, and timers that stop, each with
// not implemented rather than a copy that silently lacks the writes.
func TestPrivateDiskRuntime(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snapshots")
	h := newHarness(t, func(c *Config) {
		c.Store = withSnapshots(c.Store.(*memStore))
		c.SnapshotDir = dir
		drv, err := fake.New(fake.Config{Root: t.TempDir(), PrivateDisk: true})
		if err != nil {
			t.Fatal(err)
		}
		c.Drivers = []driver.Driver{drv}
	})
	ctx := t.Context()
	if kind := h.m.SnapshotKind("fake"); kind != "" {
		t.Errorf("snapshot kind %q, want none", kind)
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Snapshot(ctx, sb.ID, SnapshotSpec{Name: "s"}); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("snapshot: %v, want not implemented", err)
	}
	if _, err := h.m.Stop(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("stop: %v, want not implemented", err)
	}
	if _, err := h.m.Create(ctx, Spec{Template: "tiny", IdleTimeout: time.Minute, OnIdle: ActionStop}); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("create with on_idle stop: %v, want not implemented", err)
	}
	if got, _ := h.m.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("state after refusals %s", got.State)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
