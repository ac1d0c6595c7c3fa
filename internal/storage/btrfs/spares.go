package btrfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// spareRoots is how many spare root subvolumes the backend keeps ready.
// A create and delete cycle takes one and makes one, so one would do; the
// second covers a create that overlaps another.
const spareRoots = 2

// Spare roots take the seed's snapshot off CreateRoot's path. A snapshot
// costs a transaction commit; renaming a subvolume that is already committed does
// not. So the backend keeps up to spareRoots snapshots of the seed in
// spares/, makes them at New and at DeleteRoot (whose unmount commits
// anyway), and CreateRoot renames one to roots/<id>, or snapshots the
// seed itself when none is left.
//
// A spare is named <floor>-<random>, <floor> being the inode number of
// seed/floor when it was taken. Raising the floor (CreateTemplate) makes
// a new floor file, so spares taken before it no longer match and are
// never used: they are removed at the next refill. A crash leaves at most
// some spares, which the next New keeps or removes by the same rule.
// Spares are not roots: Roots does not list them, and nothing outside the
// backend sees them.

func (b *Backend) sparesDir() string { return filepath.Join(b.base, "spares") }

// readFloor sets b.floor to the inode number of seed/floor. The caller
// holds seedMu for writing, or is New.
func (b *Backend) readFloor() error {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(b.seedDir(), "floor"), &st); err != nil {
		return fmt.Errorf("reading inode floor: %w", err)
	}
	b.floor = st.Ino
	return nil
}

// sparePrefix starts the names of spares that are snapshots of the
// current seed. The caller holds seedMu.
func (b *Backend) sparePrefix() string { return strconv.FormatUint(b.floor, 10) + "-" }

// takeSpare renames a spare of the current seed to roots/<id> and reports
// whether there was one. On an error the spare stays a spare.
func (b *Backend) takeSpare(id string) (bool, error) {
	b.seedMu.RLock()
	defer b.seedMu.RUnlock()
	prefix := b.sparePrefix()
	b.spareMu.Lock()
	i := slices.IndexFunc(b.spares, func(n string) bool { return strings.HasPrefix(n, prefix) })
	if i < 0 {
		b.spareMu.Unlock()
		return false, nil
	}
	name := b.spares[i]
	b.spares = slices.Delete(b.spares, i, i+1)
	b.spareMu.Unlock()
	err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(b.sparesDir(), name),
		unix.AT_FDCWD, filepath.Join(b.rootsDir(), id), unix.RENAME_NOREPLACE)
	if err != nil {
		b.spareMu.Lock()
		b.spares = append(b.spares, name)
		b.spareMu.Unlock()
		return false, err
	}
	return true, nil
}

// fillSpares removes the spares of an older seed and makes new ones until
// spareRoots are ready; each costs a snapshot. Concurrent calls share the
// work: a spare being made counts as ready.
func (b *Backend) fillSpares(ctx context.Context) error {
	b.seedMu.RLock()
	prefix := b.sparePrefix()
	b.seedMu.RUnlock()
	b.spareMu.Lock()
	var stale []string
	b.spares = slices.DeleteFunc(b.spares, func(n string) bool {
		if strings.HasPrefix(n, prefix) {
			return false
		}
		stale = append(stale, n)
		return true
	})
	need := spareRoots - len(b.spares) - b.sparesMaking
	need = max(need, 0)
	b.sparesMaking += need
	b.spareMu.Unlock()

	// A stale spare that will not go stays listed, for the next refill
	// to try again; its prefix keeps it from being taken.
	var errs []error
	for _, n := range stale {
		if derr := b.deleteRootSubvol(b.sparesDir(), n); derr != nil {
			errs = append(errs, derr)
			b.spareMu.Lock()
			b.spares = append(b.spares, n)
			b.spareMu.Unlock()
		}
	}
	err := errors.Join(errs...)
	for ; need > 0 && err == nil; need-- {
		var name string
		if name, err = b.makeSpare(); err == nil {
			b.spareMu.Lock()
			b.spares = append(b.spares, name)
			b.sparesMaking--
			b.spareMu.Unlock()
		}
	}
	b.spareMu.Lock()
	b.sparesMaking -= need
	b.spareMu.Unlock()
	if err != nil {
		return fmt.Errorf("making spare roots: %w", err)
	}
	return nil
}

// makeSpare snapshots the seed into spares/ and returns the spare's name.
func (b *Backend) makeSpare() (string, error) {
	var r [4]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails on Linux.
	seedFd, err := openDir(b.seedDir())
	if err != nil {
		return "", err
	}
	defer unix.Close(seedFd)
	dirFd, err := openDir(b.sparesDir())
	if err != nil {
		return "", err
	}
	defer unix.Close(dirFd)
	b.seedMu.RLock()
	defer b.seedMu.RUnlock()
	name := b.sparePrefix() + hex.EncodeToString(r[:])
	return name, snapshot(seedFd, dirFd, name, 0)
}

// loadSpares lists the spares a previous run left, for fillSpares to keep
// or remove.
func (b *Backend) loadSpares() error {
	entries, err := os.ReadDir(b.sparesDir())
	if err != nil {
		return fmt.Errorf("listing spare roots: %w", err)
	}
	b.spareMu.Lock()
	defer b.spareMu.Unlock()
	for _, e := range entries {
		b.spares = append(b.spares, e.Name())
	}
	return nil
}
