package btrfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// ensureSeed creates the seed when it is missing: on the first New, or on
// a tree whose templates were made without a seed, when templates may
// already exist. It builds the seed under a temporary name and renames it
// into place, so a crash cannot leave a seed whose floor is too low.
func (b *Backend) ensureSeed() error {
	if _, err := os.Lstat(b.seedDir()); err == nil {
		return nil
	}
	const tmp = ".seed-new"
	if err := deleteSubvol(b.base, tmp); err != nil {
		return fmt.Errorf("removing unfinished seed: %w", err)
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := subvolCreate(fd, tmp); err != nil {
		return fmt.Errorf("creating seed: %w", err)
	}
	templates, err := os.ReadDir(b.templatesDir())
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var floor uint64
	for _, t := range templates {
		n, err := maxIno(filepath.Join(b.templatesDir(), t.Name()))
		if err != nil {
			return err
		}
		floor = max(floor, n)
	}
	if err := raiseFloor(filepath.Join(b.base, tmp), floor); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(b.base, tmp), b.seedDir()); err != nil {
		return fmt.Errorf("creating seed: %w", err)
	}
	return nil
}

// raiseFloor makes the seed's floor exceed the inode numbers in the
// template tree at dir.
func (b *Backend) raiseFloor(dir string) error {
	n, err := maxIno(dir)
	if err != nil {
		return err
	}
	b.seedMu.Lock()
	defer b.seedMu.Unlock()
	if err := raiseFloor(b.seedDir(), n); err != nil {
		return err
	}
	return b.readFloor()
}

// snapshotSeed creates roots/<id> as a snapshot of the seed.
func (b *Backend) snapshotSeed(id string) error {
	seedFd, err := openDir(b.seedDir())
	if err != nil {
		return err
	}
	defer unix.Close(seedFd)
	rootsFd, err := openDir(b.rootsDir())
	if err != nil {
		return err
	}
	defer unix.Close(rootsFd)
	b.seedMu.RLock()
	defer b.seedMu.RUnlock()
	return snapshot(seedFd, rootsFd, id, 0)
}

// maxIno returns the largest inode number in the tree at dir.
func maxIno(dir string) (uint64, error) {
	var n uint64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			n = max(n, sys.Ino)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("reading inode numbers of %s: %w", dir, err)
	}
	return n, nil
}

// raiseFloor makes sure that seed/floor has an inode number above n. btrfs
// numbers a subvolume's new inodes from one past the largest number in
// it (counted again at every mount), so a snapshot of the seed numbers
// its inodes above the floor. The only way to move the counter is to use
// numbers up: it takes unnamed files (O_TMPFILE, freed on close) until the
// counter passes n, then links a new floor in.
func raiseFloor(seed string, n uint64) error {
	floor := filepath.Join(seed, "floor")
	var st unix.Stat_t
	if err := unix.Lstat(floor, &st); err == nil && st.Ino > n {
		return nil
	}
	for st.Ino < n {
		fd, err := unix.Open(seed, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("raising inode floor of %s: %w", seed, err)
		}
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("raising inode floor of %s: %w", seed, err)
		}
	}
	next := floor + ".new"
	if err := os.Remove(next); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	f, err := os.OpenFile(next, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	if err := os.Rename(next, floor); err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	return nil
}
