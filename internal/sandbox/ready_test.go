package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/errdefs"
)

// checkpointer is the fake driver with a memory image: Checkpoint writes
// the instance's ID into the image, Restore creates the instance as
// Create does and records the image's ID.
type checkpointer struct {
	*fake.Driver
	mu       sync.Mutex
	restored map[string]string // new instance -> image's instance
	fail     error
}

var _ driver.Checkpointer = (*checkpointer)(nil)

func (c *checkpointer) Capabilities() driver.Capabilities {
	caps := c.Driver.Capabilities()
	caps.Checkpoint = true
	return caps
}

func (c *checkpointer) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	c.mu.Lock()
	err := c.fail
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "image"), []byte(id), 0o600)
}

func (c *checkpointer) Restore(ctx context.Context, id string, spec driver.Spec, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "image"))
	if err != nil {
		return err
	}
	if err := c.Create(ctx, spec); err != nil {
		return err
	}
	c.mu.Lock()
	c.restored[id] = string(b)
	c.mu.Unlock()
	return nil
}

func (c *checkpointer) restoredFrom(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restored[id]
}

// newReadyHarness is a snapshot harness whose driver checkpoints memory.
func newReadyHarness(t *testing.T) (*harness, *checkpointer, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snapshots")
	var ck *checkpointer
	h := newHarness(t, func(c *Config) {
		c.Store = withSnapshots(c.Store.(*memStore))
		c.SnapshotDir = dir
		ck = &checkpointer{Driver: c.Drivers[0].(*fake.Driver), restored: map[string]string{}}
		c.Drivers = []driver.Driver{ck}
	})
	return h, ck, dir
}

func snapshotDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestReadySnapshot(t *testing.T) {
	h, ck, dir := newReadyHarness(t)
	ctx := t.Context()
	tpl, err := h.m.CaptureReady(ctx, "tiny", "")
	if err != nil {
		t.Fatal(err)
	}
	name := tpl.ReadySnapshots["fake"]
	if !isReadySnapshot(name) {
		t.Fatalf("template after capture: %+v", tpl)
	}
	if got := h.m.List(context.Background(), Filter{Pooled: true}); len(got) != 0 {
		t.Fatalf("capture left sandboxes %+v", got)
	}
	if got := h.m.Snapshots(context.Background()); len(got) != 0 {
		t.Fatalf("ready snapshot listed: %+v", got)
	}
	if got := snapshotDirs(t, dir); !slices.Equal(got, []string{name}) {
		t.Fatalf("snapshot directory holds %v, want %s", got, name)
	}
	for _, err := range []error{
		h.m.DeleteSnapshot(ctx, name),
		func() error { _, err := h.m.GetSnapshot(context.Background(), name); return err }(),
		func() error { _, err := h.m.Create(ctx, Spec{FromSnapshot: name}); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("ready snapshot by name: %v, want not found", err)
		}
	}

	warm, err := h.m.Create(ctx, Spec{Template: "tiny", Env: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if ck.restoredFrom(warm.ID) == "" || warm.Env["A"] != "1" || warm.Metadata["k"] != "v" {
		t.Fatalf("create of a template with a ready snapshot: %+v, restored from %q", warm, ck.restoredFrom(warm.ID))
	}
	if got := rootFile(h, warm.ID, "hello"); got != "hi" {
		t.Fatalf("restored root holds %q", got)
	}
	for _, spec := range []Spec{
		{Template: "tiny", MemoryBytes: 128 << 20},
		{Template: "tiny", MilliCPUs: 500},
	} {
		cold, err := h.m.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if ck.restoredFrom(cold.ID) != "" {
			t.Errorf("create with other limits %+v restored the ready snapshot", spec)
		}
	}

	again, err := h.m.CaptureReady(ctx, "tiny", "fake")
	if err != nil {
		t.Fatal(err)
	}
	if n := again.ReadySnapshots["fake"]; n == name || !slices.Equal(snapshotDirs(t, dir), []string{n}) {
		t.Fatalf("re-capture: %v, directory %v", again.ReadySnapshots, snapshotDirs(t, dir))
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("deleting a template with sandboxes: %v", err)
	}
	for _, sb := range h.m.List(context.Background(), Filter{}) {
		if err := h.m.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	if got := snapshotDirs(t, dir); len(got) != 0 {
		t.Fatalf("template delete left snapshots %v", got)
	}
	h.assertClean(t)
}

func TestReadySnapshotDrop(t *testing.T) {
	h, ck, dir := newReadyHarness(t)
	ctx := t.Context()
	if _, err := h.m.DropReady(ctx, "tiny", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("drop without a ready snapshot: %v", err)
	}
	if _, err := h.m.CaptureReady(ctx, "tiny", ""); err != nil {
		t.Fatal(err)
	}
	tpl, err := h.m.DropReady(ctx, "tiny", "fake")
	if err != nil || tpl.ReadySnapshots != nil {
		t.Fatalf("drop: %v %+v", err, tpl)
	}
	if got := snapshotDirs(t, dir); len(got) != 0 {
		t.Fatalf("drop left snapshots %v", got)
	}
	cold, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if ck.restoredFrom(cold.ID) != "" {
		t.Fatal("create after the drop restored")
	}
	if err := h.m.Delete(ctx, cold.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestReadySnapshotRefusedAndRolledBack(t *testing.T) {
	h, _ := newSnapHarness(t) // the plain fake saves no memory
	ctx := t.Context()
	if _, err := h.m.CaptureReady(ctx, "tiny", ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("capture on a runtime without memory snapshots: %v", err)
	}
	if _, err := h.m.CaptureReady(ctx, "nope", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("capture of a missing template: %v", err)
	}
	if _, err := h.m.CaptureReady(ctx, "tiny", "qemu"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("capture on an unknown runtime: %v", err)
	}

	h2, ck, dir := newReadyHarness(t)
	ck.fail = errors.New("checkpoint refused")
	if _, err := h2.m.CaptureReady(ctx, "tiny", ""); err == nil {
		t.Fatal("capture with a failing checkpoint succeeded")
	}
	if tpl, _ := h2.m.Template(t.Context(), "tiny"); tpl.ReadySnapshots != nil {
		t.Fatalf("failed capture recorded %v", tpl.ReadySnapshots)
	}
	if got := snapshotDirs(t, dir); len(got) != 0 {
		t.Fatalf("failed capture left %v", got)
	}
	h2.assertClean(t)
}

func TestReadySnapshotReconcile(t *testing.T) {
	h, ck, dir := newReadyHarness(t)
	ctx := t.Context()
	tpl, err := h.m.CaptureReady(ctx, "tiny", "")
	if err != nil {
		t.Fatal(err)
	}
	// An orphan: a ready snapshot no template names.
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.snapshot(ctx, sb.ID, SnapshotSpec{Name: readyPrefix + "orphan"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.cfg.Drivers = []driver.Driver{ck}
	h.start(t)
	if got := snapshotDirs(t, dir); !slices.Equal(got, []string{tpl.ReadySnapshots["fake"]}) {
		t.Fatalf("after a restart the directory holds %v", got)
	}
	// A lost one: the template names a snapshot whose files are gone.
	if err := os.RemoveAll(filepath.Join(dir, tpl.ReadySnapshots["fake"])); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.start(t)
	if got, _ := h.m.Template(t.Context(), "tiny"); got.ReadySnapshots != nil {
		t.Fatalf("template still names a lost ready snapshot: %v", got.ReadySnapshots)
	}
}

// A template with a service: a sandbox with an environment of its own
// creates cold, as its service would start with that environment.
func TestReadySnapshotService(t *testing.T) {
	h, ck, _ := newReadyHarness(t)
	ctx := t.Context()
	if _, err := h.m.SetTemplateService(ctx, "tiny", &Service{Shell: "exec sleep 100"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.CaptureReady(ctx, "tiny", ""); err != nil {
		t.Fatal(err)
	}
	warm, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	withEnv, err := h.m.Create(ctx, Spec{Template: "tiny", Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if ck.restoredFrom(warm.ID) == "" || ck.restoredFrom(withEnv.ID) != "" {
		t.Fatalf("restored: plain %q, with an environment %q; want only the plain one", ck.restoredFrom(warm.ID), ck.restoredFrom(withEnv.ID))
	}
	for _, id := range []string{warm.ID, withEnv.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}
