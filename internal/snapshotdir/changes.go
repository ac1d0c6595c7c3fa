package snapshotdir

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// opaqueXattr marks an overlayfs upper directory that hides its lower
// directory's entries. In the tar stream it travels as a PAX xattr record.
const (
	opaqueXattr  = "trusted.overlay.opaque"
	opaqueRecord = "SCHILY.xattr." + opaqueXattr
)

// WriteChanges writes the tree at dir (an overlayfs upper directory, or
// any tree) to w as a tar stream, parents before children: directories,
// regular files (hard links as links), symlinks and whiteouts, with
// owners, modes and modification times. The root directory itself is not
// written. Other file types (fifos, sockets, devices other than
// whiteouts) are left out: a sandbox cannot make them usefully in its
// user namespace. dir must not change meanwhile; the caller freezes the
// sandbox.
func WriteChanges(ctx context.Context, w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	links := make(map[[2]uint64]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		hdr := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(st.Mode & 07777),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: timeOf(st.Mtim),
			Format:  tar.FormatPAX,
		}
		var body string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			if opaque(p) {
				hdr.PAXRecords = map[string]string{opaqueRecord: "y"}
			}
		case unix.S_IFREG:
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if st.Nlink > 1 {
				links[key] = hdr.Name
			}
			hdr.Typeflag, hdr.Size, body = tar.TypeReg, st.Size, p
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("reading %s: %w", p, err)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				return nil
			}
			hdr.Typeflag = tar.TypeChar // a whiteout: 0/0
		default:
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing %s: %w", hdr.Name, err)
		}
		if body == "" {
			return nil
		}
		return copyFile(tw, body, hdr.Size)
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	return tw.Close()
}

func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	// The sandbox is frozen, so the size cannot change; a short file
	// would corrupt the stream, so check.
	if n, err := io.Copy(w, io.LimitReader(f, size)); err != nil || n != size {
		return errors.Join(err, fmt.Errorf("%s changed while archived", p))
	}
	return nil
}

func opaque(p string) bool {
	var b [1]byte
	n, err := unix.Lgetxattr(p, opaqueXattr, b[:])
	return err == nil && n == 1 && b[0] == 'y'
}

// Apply replays a WriteChanges stream onto the tree at root, which for a
// sandbox is the overlay mount of a fresh root of the same template:
// whiteouts remove what they name, opaque directories are emptied, and
// every other entry replaces what is there. Every path resolves inside
// root, whatever symlinks the tree or the stream hold. Owners, modes
// (including setuid bits) and modification times are set as recorded;
// directory times last, once their entries exist.
func Apply(ctx context.Context, r io.Reader, root string) error {
	return ApplyShifted(ctx, r, root, IDShift{})
}

// IDShift moves the owners of the IDs From..From+Size-1 to To.. .
type IDShift struct{ From, To, Size int }

func (s IDShift) id(id int) int {
	if id >= s.From && id-s.From < s.Size {
		return id - s.From + s.To
	}
	return id
}

// ApplyShifted is Apply onto a tree that shows the stream's owners
// shifted by shift, such as a root whose layers are ID-mapped: each
// entry's owner is shifted before it is set.
func ApplyShifted(ctx context.Context, r io.Reader, root string, shift IDShift) error {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("opening %s: %w", root, err)
	}
	defer rt.Close()
	tr := tar.NewReader(r)
	var dirs []*tar.Header
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading changes: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if !fs.ValidPath(name) || name == "." {
			return fmt.Errorf("applying changes: invalid path %q", hdr.Name)
		}
		hdr.Uid, hdr.Gid = shift.id(hdr.Uid), shift.id(hdr.Gid)
		if err := applyEntry(rt, tr, hdr, name); err != nil {
			return fmt.Errorf("applying %s: %w", name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, hdr)
		}
	}
	for _, hdr := range slices.Backward(dirs) {
		if err := rt.Chtimes(path.Clean(hdr.Name), hdr.ModTime, hdr.ModTime); err != nil {
			return fmt.Errorf("applying %s: %w", hdr.Name, err)
		}
	}
	return nil
}

func applyEntry(rt *os.Root, r io.Reader, hdr *tar.Header, name string) error {
	mode := hdr.FileInfo().Mode()
	if hdr.Typeflag == tar.TypeDir {
		fi, err := rt.Lstat(name)
		switch {
		case err == nil && fi.IsDir() && hdr.PAXRecords[opaqueRecord] != "y":
		case err == nil || !errors.Is(err, fs.ErrNotExist):
			if err := rt.RemoveAll(name); err != nil {
				return err
			}
			fallthrough
		default:
			if err := rt.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
		return setOwner(rt, name, hdr, mode)
	}
	if err := rt.RemoveAll(name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeChar: // whiteout: removing was all
		return nil
	case tar.TypeReg:
		f, err := rt.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := setOwner(rt, name, hdr, mode); err != nil {
			return err
		}
		return rt.Chtimes(name, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		if err := rt.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return rt.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		target := path.Clean(hdr.Linkname)
		if !fs.ValidPath(target) {
			return fmt.Errorf("invalid link target %q", hdr.Linkname)
		}
		return rt.Link(target, name)
	}
	return nil
}

// setOwner sets owner, then mode: chown clears setuid bits.
func setOwner(rt *os.Root, name string, hdr *tar.Header, mode fs.FileMode) error {
	if err := rt.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	return rt.Chmod(name, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

// CopyTree copies the tree at src into the existing directory dst, as
// WriteChanges and Apply do.
func CopyTree(ctx context.Context, src, dst string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := WriteChanges(ctx, pw, src)
		pw.CloseWithError(err)
		done <- err
	}()
	err := Apply(ctx, pr, dst)
	pr.CloseWithError(errors.New("copy aborted"))
	return errors.Join(err, <-done)
}

func timeOf(ts unix.Timespec) time.Time { return time.Unix(ts.Unix()) }
