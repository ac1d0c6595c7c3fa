package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// Snapshotter keeps the trees that build steps produce, one per step
// cache key. A committed snapshot never changes. The builder prepares a
// writable copy of a parent snapshot, lets a step change it, and commits
// it under the step's key; on a rebuild, a key that exists is a cache hit.
// A backend with cheap snapshots (btrfs subvolumes) implements Prepare as
// a writable snapshot of the parent and Commit as making it read-only
// under its key; DirSnapshots is the portable one.
//
// Implementations are safe for concurrent use. Two builds may commit the
// same key; the second commit discards its tree, which is the same.
type Snapshotter interface {
	// Has reports whether a snapshot named key is committed.
	Has(ctx context.Context, key string) (bool, error)
	// Prepare returns a new writable directory holding a copy of the
	// committed snapshot parent, or an empty one when parent is "".
	Prepare(ctx context.Context, parent string) (dir string, err error)
	// Commit makes the prepared dir the snapshot key. dir is gone after
	// Commit returns, whatever the result.
	Commit(ctx context.Context, dir, key string) error
	// Abort removes a prepared dir that will not be committed.
	Abort(ctx context.Context, dir string) error
	// Export copies the snapshot key into dir, an existing empty
	// directory (a template being filled).
	Export(ctx context.Context, key, dir string) error
}

// DirSnapshots keeps snapshots as plain directory trees under one
// directory:
//
//	snapshots/<key>/   committed trees
//	work/<random>/     prepared trees
//
// Prepare and Export copy whole trees. Files are cloned (FICLONE) where
// the filesystem shares extents (btrfs, XFS), so a copy costs metadata
// only; elsewhere they are copied with copy_file_range, which costs the
// tree's size in disk writes. Measured for a 226 MiB tree of 16,700 files
// on this machine kind: about 1 s on btrfs, 1-2 s on ext4 with a warm
// page cache (up to 15 s when the disk is busy writing back). Ownership,
// permission bits, times, symlinks and hard links are kept; extended
// attributes, device nodes, FIFOs and sockets are not.
type DirSnapshots struct {
	dir string
	// mu is held shared by every operation and exclusively by GC.
	mu sync.RWMutex
}

var _ Snapshotter = (*DirSnapshots)(nil)

// OpenDirSnapshots opens (creating if needed) snapshots under dir and
// removes prepared trees that a crashed process left behind. One
// DirSnapshots per directory.
func OpenDirSnapshots(dir string) (*DirSnapshots, error) {
	s := &DirSnapshots{dir: dir}
	if err := os.RemoveAll(s.workDir()); err != nil {
		return nil, fmt.Errorf("clearing build work directories: %w", err)
	}
	for _, d := range []string{s.snapDir(), s.workDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating build snapshot directory: %w", err)
		}
	}
	return s, nil
}

func (s *DirSnapshots) snapDir() string { return filepath.Join(s.dir, "snapshots") }
func (s *DirSnapshots) workDir() string { return filepath.Join(s.dir, "work") }

// checkKey refuses keys that are not safe file names. Build keys are hex.
func checkKey(key string) error {
	if key == "" || len(key) > 128 || strings.Trim(key, "0123456789abcdef") != "" {
		return fmt.Errorf("snapshot key %q is not lower-case hex: %w", key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Has implements Snapshotter.
func (s *DirSnapshots) Has(ctx context.Context, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	_, err := os.Lstat(filepath.Join(s.snapDir(), key))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Prepare implements Snapshotter. It costs a copy of the parent tree.
func (s *DirSnapshots) Prepare(ctx context.Context, parent string) (string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dir, err := os.MkdirTemp(s.workDir(), "step-")
	if err != nil {
		return "", fmt.Errorf("creating build work directory: %w", err)
	}
	if parent == "" {
		if err := os.Chmod(dir, 0o755); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		return dir, nil
	}
	if err := checkKey(parent); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	src := filepath.Join(s.snapDir(), parent)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(dir)
		return "", fmt.Errorf("snapshot %s: %w", parent, errdefs.ErrNotFound)
	}
	if err := copyTree(ctx, src, dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("copying snapshot %s: %w", parent, err)
	}
	return dir, nil
}

// Commit implements Snapshotter.
func (s *DirSnapshots) Commit(ctx context.Context, dir, key string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.checkWork(dir); err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		os.RemoveAll(dir)
		return err
	}
	err := os.Rename(dir, filepath.Join(s.snapDir(), key))
	if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
		// Another build committed the same key first.
		return os.RemoveAll(dir)
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("committing snapshot %s: %w", key, err)
	}
	return nil
}

// Abort implements Snapshotter.
func (s *DirSnapshots) Abort(ctx context.Context, dir string) error {
	if err := s.checkWork(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// checkWork refuses directories that Prepare did not make.
func (s *DirSnapshots) checkWork(dir string) error {
	if filepath.Dir(dir) != s.workDir() {
		return fmt.Errorf("%s is not a prepared build directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Export implements Snapshotter. It costs a copy of the tree.
func (s *DirSnapshots) Export(ctx context.Context, key, dir string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := checkKey(key); err != nil {
		return err
	}
	src := filepath.Join(s.snapDir(), key)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot %s: %w", key, errdefs.ErrNotFound)
	}
	if err := copyTree(ctx, src, dir); err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", key, err)
	}
	return nil
}

// Keys lists the committed snapshots.
func (s *DirSnapshots) Keys(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(s.snapDir())
	if err != nil {
		return nil, fmt.Errorf("listing build snapshots: %w", err)
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// GC removes every committed snapshot whose key is not in keep and every
// prepared tree, and returns how many snapshots it removed. It waits for
// running operations and blocks new ones; run it when no build is in
// progress, or a build loses its prepared tree.
func (s *DirSnapshots) GC(ctx context.Context, keep map[string]bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.Keys(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if keep[k] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.snapDir(), k)); err != nil {
			return n, fmt.Errorf("removing build snapshot %s: %w", k, err)
		}
		n++
	}
	work, err := os.ReadDir(s.workDir())
	if err != nil {
		return n, err
	}
	for _, e := range work {
		if err := os.RemoveAll(filepath.Join(s.workDir(), e.Name())); err != nil {
			return n, fmt.Errorf("removing build work directory %s: %w", e.Name(), err)
		}
	}
	return n, nil
}

// copyOptions say how copyPath treats what it copies.
type copyOptions struct {
	// keepOwner keeps the source's owner; otherwise files belong to uid
	// and gid.
	keepOwner bool
	uid, gid  int
	// mode, if not zero, replaces the permission bits of everything copied.
	mode fs.FileMode
	// keepLinks makes files that are hard links of each other in the
	// source hard links in the copy.
	keepLinks bool
}

type inode struct{ dev, ino uint64 }

// dirMeta is a directory's metadata, applied once its contents are in
// place so that read-only directories can still be filled.
type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

// copyPath copies the file, symlink or directory tree at src in sroot to
// dst in droot. A directory merges into a directory already at dst (whose
// own metadata then stays); anything else at dst is replaced. A symlink at
// src itself is followed, within sroot; symlinks below it are copied as
// links. Reads and writes go through the roots, so neither side can reach
// outside its tree.
func copyPath(ctx context.Context, sroot *os.Root, src string, droot *os.Root, dst string, o copyOptions) error {
	chown := os.Geteuid() == 0
	links := make(map[inode]string)
	var dirs []dirMeta
	err := fs.WalkDir(sroot.FS(), src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := p
		if src != "." {
			rel = strings.TrimPrefix(strings.TrimPrefix(p, src), "/")
		}
		target := path.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		uid, gid := o.uid, o.gid
		if o.keepOwner && st != nil {
			uid, gid = int(st.Uid), int(st.Gid)
		}
		perm := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if o.mode != 0 {
			perm = o.mode
		}
		switch {
		case fi.IsDir():
			// A directory copied onto keeps its own metadata, except the
			// root of a whole-tree copy.
			created := target == "." && src == "."
			if target != "." {
				// Stat, not Lstat: a symlink to a directory inside the
				// tree (lib -> usr/lib) is merged into, as Docker does.
				existing, err := droot.Stat(target)
				if err == nil && existing.IsDir() {
					created = false
				} else {
					if err := replace(droot, target); err != nil {
						return err
					}
					if err := droot.Mkdir(target, 0o700); err != nil {
						return err
					}
					created = true
				}
			}
			if created {
				if chown {
					if err := droot.Lchown(target, uid, gid); err != nil {
						return err
					}
				}
				dirs = append(dirs, dirMeta{name: target, mode: perm, atime: atimeOf(fi), mtime: fi.ModTime()})
			}
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			dest, err := sroot.Readlink(p)
			if err != nil {
				return err
			}
			if err := replace(droot, target); err != nil {
				return err
			}
			if err := droot.Symlink(dest, target); err != nil {
				return err
			}
			if chown {
				return droot.Lchown(target, uid, gid)
			}
			return nil
		case fi.Mode().IsRegular():
			if err := replace(droot, target); err != nil {
				return err
			}
			if o.keepLinks && st != nil && st.Nlink > 1 {
				id := inode{uint64(st.Dev), st.Ino}
				if first, ok := links[id]; ok {
					return droot.Link(first, target)
				}
				links[id] = target
			}
			return copyFile(ctx, sroot, p, droot, target, fi, perm, uid, gid, chown)
		}
		// Devices, FIFOs and sockets: the runtime provides /dev and the
		// rest does not survive a copy meaningfully.
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := droot.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if err := droot.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}

// replace makes room for a non-directory at name: parents exist and
// nothing is at name.
func replace(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := root.Lstat(name); err == nil {
		return root.RemoveAll(name)
	}
	return nil
}

// copyFile copies one regular file, cloning its extents when the
// filesystem can.
func copyFile(ctx context.Context, sroot *os.Root, src string, droot *os.Root, dst string, fi fs.FileInfo, perm fs.FileMode, uid, gid int, chown bool) error {
	in, err := sroot.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := droot.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := cloneOrCopy(ctx, out, in); err != nil {
		out.Close()
		return err
	}
	if chown {
		if err := out.Chown(uid, gid); err != nil {
			out.Close()
			return err
		}
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return droot.Chtimes(dst, atimeOf(fi), fi.ModTime())
}

// cloneOrCopy shares in's extents with out when the filesystem supports
// it (FICLONE), and copies otherwise.
func cloneOrCopy(ctx context.Context, out, in *os.File) error {
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return nil
	}
	// os.File.ReadFrom uses copy_file_range, which clones where it can.
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	return ctx.Err()
}

func atimeOf(fi fs.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	return fi.ModTime()
}
