package ociimage

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyTree copies the tree at src into the existing empty directory dst,
// keeping owners, modes (with setuid, setgid and sticky bits), times,
// symlinks and hard links, including the metadata of src itself. Regular
// files are cloned (FICLONE) where the filesystem shares extents and
// copied with copy_file_range otherwise. Extended attributes, devices,
// FIFOs and sockets are not copied.
//
// It works on directory descriptors, one path component at a time, and
// opens nothing without O_NOFOLLOW, so a symlink anywhere in src (a build
// step writes whatever it likes there) is copied as a link and never
// followed, on either side. It costs about ten system calls per file,
// several times fewer than going through os.Root, which resolves every
// path from the top; src must not change while it runs (committed
// snapshots never do).
func copyTree(ctx context.Context, src, dst string) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", src, err)
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dst, err)
	}
	defer unix.Close(dfd)
	tc := &treeCopier{root: dfd, chown: os.Geteuid() == 0, links: make(map[inode]string)}
	if err := tc.dir(ctx, sfd, dfd, ""); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	return tc.meta(dfd, "", &st, false)
}

// treeCopier holds the state of one copyTree.
type treeCopier struct {
	root  int // descriptor of the destination's top directory
	chown bool
	// links maps source inodes with several links to the first copy's
	// path relative to root.
	links map[inode]string
}

// dir copies the entries of the directory open as sfd into the one open
// as dfd; rel is its path below the top, for hard links.
func (tc *treeCopier) dir(ctx context.Context, sfd, dfd int, rel string) error {
	names, err := readNames(sfd)
	if err != nil {
		return fmt.Errorf("reading directory %q: %w", rel, err)
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if err := tc.entry(ctx, sfd, dfd, name, p); err != nil {
			return fmt.Errorf("copying %q: %w", p, err)
		}
	}
	return nil
}

func (tc *treeCopier) entry(ctx context.Context, sfd, dfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return err
		}
		cs, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(cs)
		cd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(cd)
		if err := tc.dir(ctx, cs, cd, rel); err != nil {
			return err
		}
		// After the children: creating them changes the times.
		return tc.meta(cd, "", &st, false)
	case unix.S_IFLNK:
		target, err := readlinkat(sfd, name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return err
		}
		return tc.meta(dfd, name, &st, true)
	case unix.S_IFREG:
		if st.Nlink > 1 {
			id := inode{uint64(st.Dev), st.Ino}
			if first, ok := tc.links[id]; ok {
				return unix.Linkat(tc.root, first, dfd, name, 0)
			}
			tc.links[id] = rel
		}
		return tc.file(sfd, dfd, name, &st)
	}
	return nil // devices, FIFOs, sockets
}

func (tc *treeCopier) file(sfd, dfd int, name string, st *unix.Stat_t) error {
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	inf := os.NewFile(uintptr(in), name)
	defer inf.Close()
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	outf := os.NewFile(uintptr(out), name)
	defer outf.Close()
	if err := unix.IoctlFileClone(out, in); err != nil {
		// os.File.ReadFrom uses copy_file_range, which clones where it can.
		if _, err := io.Copy(outf, inf); err != nil {
			return err
		}
	}
	return tc.meta(out, "", st, false)
}

// meta applies owner, mode and times of st to name in the directory fd,
// or to fd itself when name is "". Owner goes first: chown clears setuid
// and setgid bits.
func (tc *treeCopier) meta(fd int, name string, st *unix.Stat_t, symlink bool) error {
	flags := 0
	if name == "" {
		flags = unix.AT_EMPTY_PATH
	}
	if symlink {
		flags |= unix.AT_SYMLINK_NOFOLLOW
	}
	if tc.chown {
		if err := unix.Fchownat(fd, name, int(st.Uid), int(st.Gid), flags); err != nil {
			return err
		}
	}
	if !symlink {
		// Fchmodat ignores AT_EMPTY_PATH on older kernels; the
		// descriptor itself is the file here.
		if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if name == "" {
		return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	return unix.UtimesNanoAt(fd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// readNames lists a directory open as fd without changing fd's offset
// for later readers.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
