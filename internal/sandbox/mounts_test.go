package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// fakeMounter records what the Manager asks of a Mounter.
type fakeMounter struct {
	mu       sync.Mutex
	prepared map[string][]Mount
	opts     map[string]MountOptions
	released []string
	failWith error // Prepare's error, when set
	refuse   error // Check's error, when set
}

func newFakeMounter() *fakeMounter {
	return &fakeMounter{prepared: map[string][]Mount{}, opts: map[string]MountOptions{}}
}

func (f *fakeMounter) Check([]Mount) error { return f.refuse }

func (f *fakeMounter) Prepare(_ context.Context, id string, ms []Mount, o MountOptions) ([]driver.Mount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWith != nil {
		return nil, f.failWith
	}
	f.prepared[id] = ms
	f.opts[id] = o
	out := make([]driver.Mount, len(ms))
	for i, m := range ms {
		out[i] = driver.Mount{Source: "/prepared/" + id + m.Target, Target: m.Target, ReadOnly: m.Mode == MountReadOnly}
	}
	return out, nil
}

func (f *fakeMounter) Release(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.prepared, id)
	f.released = append(f.released, id)
	return nil
}

func (f *fakeMounter) Sweep(ctx context.Context, keep func(string) bool) error {
	f.mu.Lock()
	var gone []string
	for id := range f.prepared {
		if !keep(id) {
			gone = append(gone, id)
		}
	}
	f.mu.Unlock()
	for _, id := range gone {
		f.Release(ctx, id)
	}
	return nil
}

func (f *fakeMounter) live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.prepared)
}

func TestCheckMounts(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []Mount
		err  string
	}{
		{"default mode", []Mount{{Source: "/h", Target: "/w"}}, ""},
		{"bad mode", []Mount{{Source: "/h", Target: "/w", Mode: "rx"}}, "want ro, rw or cow"},
		{"relative source", []Mount{{Source: "h", Target: "/w"}}, "absolute"},
		{"relative target", []Mount{{Source: "/h", Target: "w"}}, "clean absolute"},
		{"unclean target", []Mount{{Source: "/h", Target: "/w/../etc"}}, "clean absolute"},
		{"root", []Mount{{Source: "/h", Target: "/"}}, "replace the root"},
		{"proc", []Mount{{Source: "/h", Target: "/proc/self"}}, "belongs to the runtime"},
		{"dev", []Mount{{Source: "/h", Target: "/dev"}}, "belongs to the runtime"},
		{"agent", []Mount{{Source: "/h", Target: "/.corral"}}, "belongs to the runtime"},
		{"etc", []Mount{{Source: "/h", Target: "/etc"}}, "network setup"},
		{"hosts", []Mount{{Source: "/h", Target: "/etc/hosts"}}, "network setup"},
		{"twice", []Mount{{Source: "/h", Target: "/w"}, {Source: "/g", Target: "/w"}}, "named twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := checkMounts(tt.in)
			if tt.err == "" {
				if err != nil || out[0].Mode != MountReadWrite {
					t.Fatalf("checkMounts = %+v, %v; want rw by default", out, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("checkMounts = %v, want invalid_argument saying %q", err, tt.err)
			}
		})
	}
	out, err := checkMounts([]Mount{{Source: "/a", Target: "/w/x/y"}, {Source: "/b", Target: "/v"}, {Source: "/c", Target: "/w/xy"}})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Target != "/v" || out[1].Target != "/w/xy" || out[2].Target != "/w/x/y" {
		t.Fatalf("order %v, want shallower first", out)
	}
	if _, err := checkMounts([]Mount{{Source: "/a", Target: "/w/x"}, {Source: "/b", Target: "/w"}}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "inside mount /w") {
		t.Fatalf("nested targets: %v, want invalid_argument naming the outer mount", err)
	}
	if _, err := checkMounts(make([]Mount, MaxMounts+1)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("too many mounts: %v", err)
	}
}

func TestMountsWithoutMounter(t *testing.T) {
	h := newHarness(t, nil)
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Source: "/h", Target: "/w"}}})
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "--allow-mount") {
		t.Fatalf("create with mounts on a server without a Mounter = %v, want permission_denied naming --allow-mount", err)
	}
	h.assertClean(t)
}

func TestMountsLifecycle(t *testing.T) {
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work", Mode: MountCopyOnWrite}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Mounts) != 1 || sb.Mounts[0].Mode != MountCopyOnWrite {
		t.Fatalf("record mounts %+v", sb.Mounts)
	}
	if ds, err := h.drv.Spec(sb.ID); err != nil || len(ds.Mounts) != 1 || ds.Mounts[0].Source != "/prepared/"+sb.ID+"/work" {
		t.Fatalf("the driver got mounts %+v (%v)", ds.Mounts, err)
	}
	recs, _ := h.store.Sandboxes(ctx)
	if len(recs) != 1 || len(recs[0].Mounts) != 1 {
		t.Fatalf("stored record %+v", recs)
	}
	if _, err := h.m.Snapshot(ctx, sb.ID, SnapshotSpec{Name: "s1"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("snapshot of a mounted sandbox = %v, want failed_precondition", err)
	}
	if _, err := h.m.Fork(ctx, sb.ID, 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork of a mounted sandbox = %v, want failed_precondition", err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if fm.live() != 0 {
		t.Fatalf("mounts still prepared after delete: %v", fm.prepared)
	}
	h.assertClean(t)
}

func TestMountsFailedPrepareRollsBack(t *testing.T) {
	fm := newFakeMounter()
	fm.failWith = errdefs.Errorf(errdefs.ErrFailedPrecondition, "cannot map")
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work"}}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("create = %v, want the Mounter's failed_precondition", err)
	}
	h.assertClean(t)
}

func TestMountsRefusedByPolicy(t *testing.T) {
	fm := newFakeMounter()
	fm.refuse = errdefs.Errorf(errdefs.ErrPermissionDenied, "not beneath an allowed root")
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Source: "/etc", Target: "/work"}}})
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("create = %v, want permission_denied", err)
	}
	if _, err := h.m.Create(t.Context(), Spec{Template: "tiny", Pool: "p", Mounts: []Mount{{Source: "/r", Target: "/w"}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create from a pool with mounts = %v, want invalid_argument", err)
	}
	h.assertClean(t)
}

func TestMountsSweptOnRestart(t *testing.T) {
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	sb, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work"}}})
	if err != nil {
		t.Fatal(err)
	}
	fm.prepared["orphan1"] = []Mount{{Source: "/repo", Target: "/w"}}
	h.m.Close()
	h.start(t) // the same driver: the instance survived
	if _, ok := fm.prepared["orphan1"]; ok {
		t.Fatal("restart kept the mounts of a sandbox that has no record")
	}
	if _, ok := fm.prepared[sb.ID]; !ok {
		t.Fatal("restart removed the mounts of a recorded sandbox")
	}
}
