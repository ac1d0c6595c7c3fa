package ociimage

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

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
	c := &pathCopy{sroot: sroot, src: src, droot: droot, dst: dst, o: o, chown: os.Geteuid() == 0, links: make(map[inode]string)}
	err := fs.WalkDir(sroot.FS(), src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return c.entry(ctx, p, d)
	})
	if err != nil {
		return err
	}
	return c.setDirMeta()
}

// pathCopy is one copyPath under way.
type pathCopy struct {
	sroot, droot *os.Root
	src, dst     string
	o            copyOptions
	chown        bool             // running as root, so owners can be set
	links        map[inode]string // first copy of each hard-linked file
	dirs         []dirMeta        // created directories, parents first
}

// owned is the owner and permission bits an entry gets in the copy.
type owned struct {
	uid, gid int
	perm     fs.FileMode
}

// entry copies the entry p of the walk.
func (c *pathCopy) entry(ctx context.Context, p string, d fs.DirEntry) error {
	rel := p
	if c.src != "." {
		rel = strings.TrimPrefix(strings.TrimPrefix(p, c.src), "/")
	}
	target := path.Join(c.dst, rel)
	fi, err := d.Info()
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	own := owned{uid: c.o.uid, gid: c.o.gid}
	if c.o.keepOwner && st != nil {
		own.uid, own.gid = int(st.Uid), int(st.Gid)
	}
	own.perm = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if c.o.mode != 0 {
		own.perm = c.o.mode
	}
	switch {
	case fi.IsDir():
		return c.dir(target, fi, own)
	case fi.Mode()&fs.ModeSymlink != 0:
		return c.symlink(p, target, own)
	case fi.Mode().IsRegular():
		return c.file(ctx, p, target, fi, st, own)
	}
	// Devices, FIFOs and sockets: the runtime provides /dev and the
	// rest does not survive a copy meaningfully.
	return nil
}

// dir makes the directory target unless one is there already, and keeps
// its metadata for setDirMeta.
func (c *pathCopy) dir(target string, fi fs.FileInfo, own owned) error {
	// A directory copied onto keeps its own metadata, except the root of
	// a whole-tree copy.
	created := target == "." && c.src == "."
	if target != "." {
		// Stat, not Lstat: a symlink to a directory inside the tree
		// (lib -> usr/lib) is merged into, as Docker does.
		existing, err := c.droot.Stat(target)
		if err == nil && existing.IsDir() {
			created = false
		} else {
			if err := replace(c.droot, target); err != nil {
				return err
			}
			if err := c.droot.Mkdir(target, 0o700); err != nil {
				return err
			}
			created = true
		}
	}
	if !created {
		return nil
	}
	if c.chown {
		if err := c.droot.Lchown(target, own.uid, own.gid); err != nil {
			return err
		}
	}
	c.dirs = append(c.dirs, dirMeta{name: target, mode: own.perm, atime: atimeOf(fi), mtime: fi.ModTime()})
	return nil
}

// symlink copies the link at p as a link.
func (c *pathCopy) symlink(p, target string, own owned) error {
	dest, err := c.sroot.Readlink(p)
	if err != nil {
		return err
	}
	if err := replace(c.droot, target); err != nil {
		return err
	}
	if err := c.droot.Symlink(dest, target); err != nil {
		return err
	}
	if c.chown {
		return c.droot.Lchown(target, own.uid, own.gid)
	}
	return nil
}

// file copies the regular file at p, or links it to its first copy when
// hard links are kept.
func (c *pathCopy) file(ctx context.Context, p, target string, fi fs.FileInfo, st *syscall.Stat_t, own owned) error {
	if err := replace(c.droot, target); err != nil {
		return err
	}
	if c.o.keepLinks && st != nil && st.Nlink > 1 {
		id := inode{uint64(st.Dev), st.Ino}
		if first, ok := c.links[id]; ok {
			return c.droot.Link(first, target)
		}
		c.links[id] = target
	}
	return copyFile(ctx, c.sroot, p, c.droot, target, fi, own.perm, own.uid, own.gid, c.chown)
}

// setDirMeta applies the created directories' modes and times, children
// first, once everything is in them: a read-only directory could not be
// filled, and filling one changes its times.
func (c *pathCopy) setDirMeta() error {
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if err := c.droot.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if err := c.droot.Chtimes(d.name, d.atime, d.mtime); err != nil {
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
