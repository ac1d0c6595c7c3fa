package mounts

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/sandbox"
)

// TestDetachKeepsTheLayerForTheNextPrepare detaches a cow mount whose
// layer lies in a directory the storage names, as a stop does, and
// prepares it again, as a start does: the second Prepare finds the layer
// and its link from the first, and the change made before shows again.
func TestDetachKeepsTheLayerForTheNextPrepare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers bool
	}{
		{name: "state directory"},
		{name: "layer directory", layers: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			repo := e.dir(t, "repo", 1000, 1000)
			o := sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot}
			if tc.layers {
				o.LayerDir = filepath.Join(t.TempDir(), "layers")
				if err := os.Mkdir(o.LayerDir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			ms := []sandbox.Mount{{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite}}
			ctx := context.Background()
			dm, err := e.m.Prepare(ctx, "detach1", ms, o)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dm[0].Source, "new"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := e.m.Detach(ctx, "detach1"); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			dm, err = e.m.Prepare(ctx, "detach1", ms, o)
			if err != nil {
				t.Fatalf("Prepare after Detach: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(dm[0].Source, "new")); err != nil || string(b) != "x" {
				t.Fatalf("the change made before Detach reads %q, %v; want x", b, err)
			}
			e.release(t, "detach1")
		})
	}
}

// TestFailedPrepareKeepsDetachedLayers fails the Prepare of a start (a
// mount's source went away while the sandbox was stopped): the cow layer
// a Detach kept stays, with its change, for the Prepare after.
func TestFailedPrepareKeepsDetachedLayers(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	other := e.dir(t, "other", 1000, 1000)
	ms := []sandbox.Mount{
		{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite},
		{Source: other, Target: "/o", Mode: sandbox.MountReadOnly},
	}
	ctx := context.Background()
	dm := e.prepare(t, "keep1", ms...)
	if err := os.WriteFile(filepath.Join(dm[0].Source, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Detach(ctx, "keep1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, other+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Prepare(ctx, "keep1", ms, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot}); err == nil {
		t.Fatal("Prepare of a missing source succeeded")
	}
	if err := os.Rename(other+".away", other); err != nil {
		t.Fatal(err)
	}
	dm = e.prepare(t, "keep1", ms...)
	if b, err := os.ReadFile(filepath.Join(dm[0].Source, "new")); err != nil || string(b) != "x" {
		t.Fatalf("after a failed Prepare the change reads %q, %v; want x", b, err)
	}
	e.release(t, "keep1")
}

// TestCowLayerKeepsStoredIDs prepares a cow mount for a sandbox that runs
// in a range of its own, writes as its root, and prepares it again after
// a Detach for another range, as a start after a stop gets: the file is in
// the stored range on disk and shows as the new range's root.
func TestCowLayerKeepsStoredIDs(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	ctx := context.Background()
	ms := []sandbox.Mount{{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite}}
	first := driver.HostIDs{UID: driver.StoredIDBase + 2*driver.StoredIDSize, GID: driver.StoredIDBase + 2*driver.StoredIDSize}
	second := driver.HostIDs{UID: first.UID + driver.StoredIDSize, GID: first.GID + driver.StoredIDSize}
	dm, err := e.m.Prepare(ctx, "range1", ms, sandbox.MountOptions{Root: first, User: first})
	if err != nil {
		t.Fatal(err)
	}
	runAs(t, first, dm[0].Source, `echo x > byroot && mkdir rootdir`)
	checkOwner(t, filepath.Join(dm[0].Source, "byroot"), first)
	stored := driver.HostIDs{UID: driver.StoredIDBase, GID: driver.StoredIDBase}
	checkOwner(t, filepath.Join(e.state, "range1", "0", "upper", "byroot"), stored)
	if err := e.m.Detach(ctx, "range1"); err != nil {
		t.Fatal(err)
	}
	dm, err = e.m.Prepare(ctx, "range1", ms, sandbox.MountOptions{Root: second, User: second})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"byroot", "rootdir", "hello"} {
		checkOwner(t, filepath.Join(dm[0].Source, name), second)
	}
	runAs(t, second, dm[0].Source, `echo y >> byroot && touch rootdir/in && rm hello`)
	changes, err := e.m.Changes("range1", 0, "/w")
	want := []sandbox.Change{{Path: "/w/byroot", Kind: sandbox.ChangeAdded}, {Path: "/w/hello", Kind: sandbox.ChangeDeleted},
		{Path: "/w/rootdir", Kind: sandbox.ChangeAdded}, {Path: "/w/rootdir/in", Kind: sandbox.ChangeAdded}}
	if err != nil || !slices.Equal(changes, want) {
		t.Errorf("Changes = %v, %v; want %v", changes, err, want)
	}
	e.release(t, "range1")
}
