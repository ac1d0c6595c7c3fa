package btrfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

// spareIDs returns the subvolume IDs of the spares on disk, sorted.
func spareIDs(t *testing.T, b *Backend) []uint64 {
	t.Helper()
	entries, err := os.ReadDir(b.sparesDir())
	must(t, err)
	var ids []uint64
	for _, e := range entries {
		ids = append(ids, subvolIDOf(t, filepath.Join(b.sparesDir(), e.Name())))
	}
	slices.Sort(ids)
	return ids
}

func TestCreateRootTakesSpare(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	spares := spareIDs(t, b)
	if len(spares) != spareRoots {
		t.Fatalf("New made %d spare roots, want %d", len(spares), spareRoots)
	}
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	id := subvolIDOf(t, filepath.Join(b.rootsDir(), "r1"))
	if !slices.Contains(spares, id) {
		t.Errorf("root r1 is subvolume %d, not one of the spares %v", id, spares)
	}
	if got := spareIDs(t, b); len(got) != spareRoots-1 {
		t.Errorf("spares after CreateRoot: %v, want %d", got, spareRoots-1)
	}
	// An existing id fails and leaves the spare in place.
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("CreateRoot of an existing id: %v, want already exists", err)
	}
	if got := spareIDs(t, b); len(got) != spareRoots-1 {
		t.Errorf("spares after a failed CreateRoot: %v, want %d", got, spareRoots-1)
	}
	must(t, b.DeleteRoot(t.Context(), "r1"))
	if got := spareIDs(t, b); len(got) != spareRoots {
		t.Errorf("spares after DeleteRoot: %v, want %d", got, spareRoots)
	}
	// With every spare taken, CreateRoot snapshots the seed itself.
	var ids []string
	for i := range spareRoots + 1 {
		id := "more" + strconv.Itoa(i)
		if _, err := b.CreateRoot(t.Context(), id, "base", storage.RootOptions{}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if got := spareIDs(t, b); len(got) != 0 {
		t.Errorf("spares left after %d creates: %v", spareRoots+1, got)
	}
	for _, id := range ids {
		must(t, b.DeleteRoot(t.Context(), id))
	}
	if got, err := b.Roots(t.Context()); err != nil || len(got) != 0 {
		t.Errorf("Roots = %v, %v; want none (spares are not roots)", got, err)
	}
}

// Spares taken before a template raised the seed's floor would number new
// files like the template's: CreateRoot must not use them, and the next
// refill removes them, qgroups included.
func TestSparesOfLowerFloorUnused(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "small", writeFile("f", "1")))
	// Turn quotas on, so that the spares made from now on have qgroups.
	if _, err := b.CreateRoot(t.Context(), "limited", "small", storage.RootOptions{DiskBytes: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	must(t, b.DeleteRoot(t.Context(), "limited"))
	stale := spareIDs(t, b)
	if len(stale) != spareRoots {
		t.Fatalf("spares: %v, want %d", stale, spareRoots)
	}
	for _, id := range stale {
		if _, err := os.Stat(filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id))); err != nil {
			t.Fatalf("spare %d has no qgroup: %v", id, err)
		}
	}
	must(t, b.CreateTemplate(t.Context(), "big", func(dir string) error {
		for i := range 300 {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644); err != nil {
				return err
			}
		}
		return nil
	}))
	checkNewInodes(t, b, "big") // its DeleteRoot refills the spares

	got := spareIDs(t, b)
	if len(got) != spareRoots {
		t.Errorf("spares after refill: %v, want %d", got, spareRoots)
	}
	for _, id := range stale {
		if slices.Contains(got, id) {
			t.Errorf("spare %d of the old floor is still there", id)
		}
		waitQgroupGone(t, b, id)
	}
	prefix := strconv.FormatUint(b.floor, 10) + "-"
	entries, err := os.ReadDir(b.sparesDir())
	must(t, err)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			t.Errorf("spare %s does not match floor %d", e.Name(), b.floor)
		}
	}
}

// takeSpare only takes spares of the current floor: one of an older floor
// stays until the next refill removes it.
func TestCreateRootSkipsSpareOfOtherFloor(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	for _, name := range slices.Clone(b.spares) {
		must(t, deleteSubvol(b.sparesDir(), name))
	}
	const stale = "1-00000000"
	must(t, snapshotAt(b.seedDir(), b.sparesDir(), stale, 0))
	b.spares = []string{stale}
	staleID := subvolIDOf(t, filepath.Join(b.sparesDir(), stale))
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	if id := subvolIDOf(t, filepath.Join(b.rootsDir(), "r1")); id == staleID {
		t.Errorf("root r1 is the spare of another floor (%d)", id)
	}
	must(t, b.DeleteRoot(t.Context(), "r1"))
	got := spareIDs(t, b)
	if len(got) != spareRoots || slices.Contains(got, staleID) {
		t.Errorf("spares after DeleteRoot: %v, want %d new ones", got, spareRoots)
	}
}

// A crash leaves spares behind, maybe of an older seed, maybe a stray
// directory: New keeps those it can use and removes the others.
func TestNewSortsLeftoverSpares(t *testing.T) {
	b, dir := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	kept := spareIDs(t, b)
	must(t, snapshotAt(b.seedDir(), b.sparesDir(), "1-00000000", 0))
	must(t, os.Mkdir(filepath.Join(b.sparesDir(), "stray"), 0o700))
	must(t, b.Close())

	b2 := openTestBackend(t, dir)
	if got := spareIDs(t, b2); !cmp.Equal(got, kept) {
		t.Errorf("spares after reopening: %v, want the old ones %v", got, kept)
	}
	checkNewInodes(t, b2, "base")
}
