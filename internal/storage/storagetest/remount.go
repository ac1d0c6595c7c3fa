package storagetest

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
)

// testUnmountAndMountRoot checks that a root unmounted (as a stopped
// sandbox's is, and as a reboot leaves it) keeps its files and shows them
// again once mounted, also after its template was deleted and the
// backend opened again; that both calls are idempotent; and that an
// unmounted root deletes cleanly.
func testUnmountAndMountRoot(t *testing.T, b storage.Backend, reopen Reopen) {
	if _, ok := b.(storage.RootMounter); !ok {
		t.Skip("the backend's roots are no mounts")
	}
	ctx := t.Context()
	createTemplate(t, b, "base")
	state := stateDir(b)
	mountsBefore := testutil.Mounts(t, state)
	path := createRoot(t, b, "r1", "base")
	mustWrite(t, filepath.Join(path, "mine"), "r1")

	rm := b.(storage.RootMounter)
	for range 2 {
		if err := rm.UnmountRoot(ctx, "r1"); err != nil {
			t.Fatalf("UnmountRoot: %v", err)
		}
	}
	if diff := cmp.Diff(mountsBefore, testutil.Mounts(t, state)); diff != "" {
		t.Errorf("mounts after UnmountRoot (-before +after):\n%s", diff)
	}
	if err := b.DeleteTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if reopen != nil {
		b = reopen(t, b)
		rm = b.(storage.RootMounter)
	}
	for range 2 {
		got, err := rm.MountRoot(ctx, "r1", nil)
		if err != nil || got != path {
			t.Fatalf("MountRoot = %q, %v; want %q", got, err, path)
		}
	}
	if got := readFile(t, filepath.Join(path, "mine")); got != "r1" {
		t.Errorf("root reads %q after MountRoot", got)
	}
	checkSample(t, path)
	n := 0
	for _, mp := range testutil.Mounts(t, state) {
		if mp == path {
			n++
		}
	}
	if n != 1 {
		t.Errorf("root mounted %d times after MountRoot twice, want once", n)
	}
	if _, err := rm.MountRoot(ctx, "nosuch", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("MountRoot of an unknown root = %v, want not_found", err)
	}
	if err := rm.UnmountRoot(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteRoot(ctx, "r1"); err != nil {
		t.Fatalf("DeleteRoot of an unmounted root: %v", err)
	}
	if got := roots(t, b); len(got) != 0 {
		t.Errorf("roots after delete: %v", got)
	}
}
