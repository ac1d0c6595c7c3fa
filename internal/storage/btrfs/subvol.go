package btrfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// deleteSubvol deletes the subvolume parent/name and every subvolume
// nested in it. A missing name is not an error; a plain directory (which
// no code path creates, but a crash or a human might) is removed as such.
func deleteSubvol(parent, name string) error {
	path := filepath.Join(parent, name)
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !isSubvolRoot(st) {
		return os.RemoveAll(path)
	}
	dirFd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	err = snapDestroy(dirFd, name)
	if errors.Is(err, unix.ENOTEMPTY) {
		// The subvolume holds others; the kernel deletes only leaves. A
		// read-only subvolume cannot have its children unlinked, so clear
		// the flag first (we are deleting it anyway).
		if err := setReadOnly(path, false); err != nil {
			return err
		}
		if err := deleteNested(path); err != nil {
			return err
		}
		err = snapDestroy(dirFd, name)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("destroying subvolume %s: %w", path, err)
	}
	return nil
}

// deleteNested deletes the subvolumes inside the subvolume at path.
func deleteNested(path string) error {
	var nested []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == path {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if isSubvolRoot(info) {
			nested = append(nested, p)
			return fs.SkipDir // deleteSubvol handles what is inside it
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("finding subvolumes inside %s: %w", path, err)
	}
	slices.Reverse(nested)
	for _, p := range nested {
		if err := deleteSubvol(filepath.Dir(p), filepath.Base(p)); err != nil {
			return err
		}
	}
	return nil
}

// isSubvolRoot reports whether st is the root directory of a subvolume:
// on btrfs those, and only those, have inode number 256
// (BTRFS_FIRST_FREE_OBJECTID).
func isSubvolRoot(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.IsDir() && sys.Ino == firstFreeObjectID
}

// setReadOnly sets or clears the read-only flag of the subvolume at path.
func setReadOnly(path string, ro bool) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := subvolFlags(fd)
	if err != nil {
		return fmt.Errorf("reading flags of subvolume %s: %w", path, err)
	}
	want := flags &^ subvolRdonly
	if ro {
		want |= subvolRdonly
	}
	if want == flags {
		return nil
	}
	if err := setSubvolFlags(fd, want); err != nil {
		return fmt.Errorf("setting flags of subvolume %s: %w", path, err)
	}
	return nil
}

func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// subvolIDAt returns the ID of the subvolume whose top directory is path.
func subvolIDAt(path string) (uint64, error) {
	fd, err := openDir(path)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return 0, fmt.Errorf("looking up subvolume id of %s: %w", path, err)
	}
	return id, nil
}

func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("checking filesystem of %s: %w", path, err)
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}
