package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func newForkVolumeHarness(t *testing.T) (*harness, *fakeMounter) {
	fm := newFakeMounter()
	dir := filepath.Join(t.TempDir(), "snapshots")
	h := newHarness(t, func(c *Config) {
		c.Store = withSnapshots(c.Store.(*memStore))
		c.SnapshotDir = dir
		c.Mounter = fm
	})
	return h, fm
}

func TestForkVolumes(t *testing.T) {
	h, fm := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.VolumeWriteFile(ctx, "data", "/f", strings.NewReader("orig"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Fork(ctx, src.ID, 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork of a sandbox with volumes without a choice = %v, want failed_precondition", err)
	}
	if _, err := h.m.ForkWith(ctx, src.ID, 1, ForkOptions{Volumes: "both"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("fork with volumes=both = %v, want invalid_argument", err)
	}

	shared, err := h.m.ForkWith(ctx, src.ID, 2, ForkOptions{Volumes: VolumesShare})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range shared {
		if c.Mounts[0].Volume != "data" || fm.prepared[c.ID][0].Source != h.storage.VolumePath("data") {
			t.Errorf("shared fork %s mounts %+v", c.ID, c.Mounts)
		}
	}

	copies, err := h.m.ForkWith(ctx, src.ID, 2, ForkOptions{Volumes: VolumesCopy})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range copies {
		want := "data-" + c.ID
		if c.Mounts[0].Volume != want {
			t.Fatalf("copied fork %s mounts %+v, want volume %s", c.ID, c.Mounts, want)
		}
		v, err := h.m.Volume(ctx, want)
		if err != nil || len(v.InUseBy) != 1 || v.InUseBy[0] != c.ID {
			t.Fatalf("copy %s: %+v, %v", want, v, err)
		}
		b, _ := os.ReadFile(filepath.Join(h.storage.VolumePath(want), "f"))
		if string(b) != "orig" {
			t.Errorf("copy %s holds %q", want, b)
		}
		os.WriteFile(filepath.Join(h.storage.VolumePath(want), "f"), []byte(c.ID), 0o644)
	}
	if b, _ := os.ReadFile(filepath.Join(h.storage.VolumePath("data"), "f")); string(b) != "orig" {
		t.Errorf("writing a copy changed the original: %q", b)
	}
	if v, _ := h.m.Volume(ctx, "data"); len(v.InUseBy) != 3 {
		t.Errorf("the original is used by %v, want the source and the two sharing forks", v.InUseBy)
	}
}

func TestForkVolumesRefusesHostMounts(t *testing.T) {
	h, _ := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data"}, {Source: "/repo", Target: "/repo"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.ForkWith(ctx, src.ID, 1, ForkOptions{Volumes: VolumesCopy}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork with a host mount = %v, want failed_precondition", err)
	}
	if list, _ := h.m.Volumes(ctx); len(list) != 1 {
		t.Fatalf("a refused fork left volumes: %+v", list)
	}
}

func TestForkVolumesRollsBackCopies(t *testing.T) {
	h, _ := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	h.setFailDriver(func(id string) error {
		if id != src.ID {
			return errors.New("no room")
		}
		return nil
	})
	if _, err := h.m.ForkWith(ctx, src.ID, 2, ForkOptions{Volumes: VolumesCopy}); err == nil {
		t.Fatal("fork succeeded with a failing driver")
	}
	if list, _ := h.m.Volumes(ctx); len(list) != 1 || list[0].Name != "data" {
		t.Fatalf("a failed fork left volumes: %+v", list)
	}
	if names, _ := h.storage.Volumes(ctx); len(names) != 1 {
		t.Fatalf("a failed fork left volume trees: %v", names)
	}
}

func TestSnapshotVolumes(t *testing.T) {
	h, _ := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.VolumeWriteFile(ctx, "data", "/f", strings.NewReader("orig"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data", Mode: MountReadOnly}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s0"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("snapshot with volumes without a choice = %v, want failed_precondition", err)
	}
	shared, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "shared", Volumes: VolumesShare})
	if err != nil {
		t.Fatal(err)
	}
	if len(shared.Mounts) != 1 || shared.Mounts[0].Volume != "data" || shared.VolumesCopied {
		t.Fatalf("shared snapshot %+v", shared)
	}
	copied, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "copied", Volumes: VolumesCopy})
	if err != nil {
		t.Fatal(err)
	}
	if len(copied.Mounts) != 1 || copied.Mounts[0].Volume != "data-copied" || copied.Mounts[0].Mode != MountReadOnly {
		t.Fatalf("copied snapshot %+v", copied)
	}
	if err := h.m.VolumeWriteFile(ctx, "data", "/f", strings.NewReader("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := h.m.Create(ctx, Spec{FromSnapshot: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Mounts[0].Volume != "data" {
		t.Errorf("a sandbox from the shared snapshot mounts %+v", a.Mounts)
	}
	b, err := h.m.Create(ctx, Spec{FromSnapshot: "copied"})
	if err != nil {
		t.Fatal(err)
	}
	want := "data-copied-" + b.ID
	if b.Mounts[0].Volume != want {
		t.Fatalf("a sandbox from the copied snapshot mounts %+v, want %s", b.Mounts, want)
	}
	if got, _ := os.ReadFile(filepath.Join(h.storage.VolumePath(want), "f")); string(got) != "orig" {
		t.Errorf("its copy holds %q, want what the volume held at the snapshot", got)
	}
	for _, v := range []string{"data", "data-copied"} {
		if err := h.m.DeleteVolume(ctx, v); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("delete of %s kept by a snapshot = %v, want failed_precondition", v, err)
		}
	}
	if err := h.m.DeleteSnapshot(ctx, "copied"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Volume(ctx, "data-copied"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the snapshot's copy outlived it: %v", err)
	}
}

// TestForkVolumesRefusesCowVolumes refuses forks and snapshots of a
// sandbox that mounts a volume cow, whose changes lie in a layer of the
// sandbox's own that a copy would not have, and leaves no copy behind.
func TestForkVolumesRefusesCowVolumes(t *testing.T) {
	h, _ := newForkVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	src, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "data", Target: "/data", Mode: MountCopyOnWrite}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{VolumesShare, VolumesCopy} {
		if _, err := h.m.ForkWith(ctx, src.ID, 1, ForkOptions{Volumes: v}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("fork with volumes %s of a cow volume mount = %v, want failed_precondition", v, err)
		}
		if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s-" + v, Volumes: v}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("snapshot with volumes %s of a cow volume mount = %v, want failed_precondition", v, err)
		}
	}
	if list, _ := h.m.Volumes(ctx); len(list) != 1 {
		t.Fatalf("refused forks and snapshots left volumes: %+v", list)
	}
}

// TestCopyName: a copy's name is <volume>-<owner>, and a volume name cut
// to fit keeps copies of two volumes that share the kept part apart.
func TestCopyName(t *testing.T) {
	if got := copyName("data", "0123456789abcdef"); got != "data-0123456789abcdef" {
		t.Errorf("copyName(data) = %q", got)
	}
	long := strings.Repeat("v", 58)
	a, b := copyName(long+"-one", "0123456789abcdef"), copyName(long+"-two", "0123456789abcdef")
	for _, n := range []string{a, b} {
		if err := checkVolumeName(n); err != nil || len(n) > 63 || !strings.HasSuffix(n, "-0123456789abcdef") {
			t.Errorf("copy name %q (%d characters): %v", n, len(n), err)
		}
	}
	if a == b {
		t.Errorf("two volumes cut to the same part get one copy name %q", a)
	}
}
