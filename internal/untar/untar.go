package untar

import (
	"archive/tar"
	"compress/flate"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Writer writes tar entries into the tree opened as root. Every write,
// removal and lookup goes through root. Entries are applied in the order
// given, a later one replacing an earlier one of the same name (a directory
// merges into an existing directory). Ownership (uid/gid as numbers) is
// applied when the process runs as root, as tar does.
//
// Directories are created owner-only and get their modes and times from
// Finish, so that read-only directories can still be filled; memory grows
// with the number of directory entries. A Writer is not safe for
// concurrent use.
type Writer struct {
	root  *os.Root
	chown bool
	buf   []byte
	dirs  []dirMeta
}

type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

// NewWriter returns a Writer into root that copies file contents through
// buf, which must not be empty and must not be used by anything else until
// the Writer is done.
func NewWriter(root *os.Root, buf []byte) *Writer {
	return &Writer{root: root, chown: os.Geteuid() == 0, buf: buf}
}

// CleanName turns an archive member name into a clean path relative to the
// root: "." for the root itself, never leading above it.
//
// Leading slashes are dropped (archives made with `tar -C / ...` have
// them); a name that still climbs above the root after cleaning
// ("a/../../b") is refused rather than clamped: an archive that names such
// a path is broken or hostile.
func CleanName(name string) (string, error) {
	n := strings.TrimLeft(name, "/")
	if n == "" {
		return ".", nil
	}
	n = path.Clean(n)
	if n == ".." || strings.HasPrefix(n, "../") {
		return "", fmt.Errorf("path escapes the rootfs: %w", errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// StreamError marks errors that mean an archive is malformed or truncated
// (tar, gzip or deflate) as invalid arguments; errors of the underlying
// reader pass through unchanged.
func StreamError(err error) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// Entry writes the entry hdr, whose contents r yields, and reports whether
// it wrote anything. Regular files, directories, symlinks and hard links
// are written; character and block devices and FIFOs are skipped (wrote is
// false), because the runtime provides /dev. Sparse files and every other
// type are refused. A symlink's target is stored as it is: an absolute
// target resolves inside the sandbox, never on the host, because nothing
// here follows it. A hard link's target is a member name and must lie in
// the tree.
//
// An entry that would leave the tree, by its name or through a symlink, or
// replace the root with a non-directory, fails with an error wrapping
// errdefs.ErrInvalidArgument that says why. ctx is checked between chunks
// of a file.
func (w *Writer) Entry(ctx context.Context, hdr *tar.Header, r io.Reader) (wrote bool, err error) {
	name, err := CleanName(hdr.Name)
	if err != nil {
		return false, err
	}
	var target string
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = w.dir(name, hdr)
	case tar.TypeReg, tar.TypeCont:
		if isSparse(hdr) {
			return false, errSparse()
		}
		err = w.file(ctx, name, hdr, r)
	case tar.TypeGNUSparse:
		return false, errSparse()
	case tar.TypeSymlink:
		err = w.symlink(name, hdr)
	case tar.TypeLink:
		if target, err = CleanName(hdr.Linkname); err != nil {
			return false, fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		err = w.hardlink(name, target)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return false, nil
	default:
		return false, fmt.Errorf("unsupported entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return false, w.Classify(err, name, target)
	}
	return true, nil
}

// Classify turns a refusal of os.Root to leave the tree, met while working
// on the given paths (clean names, "" ignored), into an error that names
// the symlink and wraps errdefs.ErrInvalidArgument. os.Root's own error is
// not exported, so the link is found by walking the parents of the paths;
// safety never depends on this walk, only the message and kind do. Other
// errors, and nil, are returned unchanged.
func (w *Writer) Classify(err error, paths ...string) error {
	if err == nil || errors.Is(err, errdefs.ErrInvalidArgument) {
		return err
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if link, dest, ok := escapingLink(w.root, path.Dir(p)); ok {
			return fmt.Errorf("path escapes the rootfs through symlink %q -> %q: %w", link, dest, errdefs.ErrInvalidArgument)
		}
	}
	return err
}

// Finish applies directory modes and times, in archive order so that a
// later entry for the same directory wins. Call it once, after the last
// entry.
func (w *Writer) Finish() error {
	for _, d := range w.dirs {
		// A later entry (or a caller's removal) may have replaced the
		// directory; its own metadata is already in place.
		if fi, err := w.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		if err := w.root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("setting mode of directory %q: %w", d.name, err)
		}
		if err := w.root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return fmt.Errorf("setting times of directory %q: %w", d.name, err)
		}
	}
	return nil
}

func errReplaceRoot() error {
	return fmt.Errorf("entry would replace the rootfs directory itself: %w", errdefs.ErrInvalidArgument)
}

func errSparse() error {
	return fmt.Errorf("sparse files are not supported: %w", errdefs.ErrInvalidArgument)
}

// isSparse reports whether hdr is a PAX-format GNU sparse file. The tar
// reader fills holes with zeros, so a few bytes of archive could claim
// terabytes of file; rootfs tarballs and image layers do not use sparse
// entries (GNU tar makes them only with --sparse, image builders never).
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// prepare makes the parent directories of name and removes whatever is at
// name, unless both it and the new entry are directories. It reports
// whether a directory was kept.
func (w *Writer) prepare(name string, isDir bool) (kept bool, err error) {
	if d := path.Dir(name); d != "." {
		if err := w.root.MkdirAll(d, 0o755); err != nil {
			return false, err
		}
	}
	fi, err := w.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if isDir && fi.IsDir() {
		return true, nil
	}
	return false, w.root.RemoveAll(name)
}

func (w *Writer) dir(name string, hdr *tar.Header) error {
	if name != "." {
		kept, err := w.prepare(name, true)
		if err != nil {
			return err
		}
		if !kept {
			// Owner-only until Finish applies the real mode.
			if err := w.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
	}
	if w.chown {
		if err := w.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	w.dirs = append(w.dirs, dirMeta{name: name, mode: mode(hdr), atime: atime(hdr), mtime: hdr.ModTime})
	return nil
}

func (w *Writer) file(ctx context.Context, name string, hdr *tar.Header, r io.Reader) error {
	if name == "." {
		return errReplaceRoot()
	}
	if _, err := w.prepare(name, false); err != nil {
		return err
	}
	// O_EXCL: prepare removed the old entry, so nothing at name is followed.
	f, err := w.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := w.fill(ctx, f, hdr, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return w.root.Chtimes(name, atime(hdr), hdr.ModTime)
}

// fill copies the entry's contents into f and sets owner and mode through
// the open descriptor, owner first (see SetFileMode).
func (w *Writer) fill(ctx context.Context, f *os.File, hdr *tar.Header, r io.Reader) error {
	if err := copyChunks(ctx, f, r, w.buf); err != nil {
		return err
	}
	if w.chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	return SetFileMode(f, mode(hdr))
}

// ModeBits are the bits of a file's mode that an archive entry or a file
// write sets: permissions, setuid, setgid and sticky.
const ModeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// SetFileMode gives the regular file f exactly the ModeBits of m, setuid
// and setgid included, as tar does. It must come after the last write to
// f and after its chown: the kernel clears setuid and setgid on a chown,
// and on a write by a process without CAP_FSETID over the host, which is
// every process of a sandbox with a user namespace of its own.
func SetFileMode(f *os.File, m fs.FileMode) error {
	return f.Chmod(m & ModeBits)
}

func (w *Writer) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return errReplaceRoot()
	}
	if hdr.Linkname == "" {
		return fmt.Errorf("symlink has an empty target: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := w.prepare(name, false); err != nil {
		return err
	}
	if err := w.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	if w.chown {
		return w.root.Lchown(name, hdr.Uid, hdr.Gid)
	}
	return nil
}

func (w *Writer) hardlink(name, target string) error {
	if name == "." {
		return errReplaceRoot()
	}
	if name == target {
		return nil // a link to itself is already in place
	}
	if _, err := w.prepare(name, false); err != nil {
		return err
	}
	return w.root.Link(target, name)
}

// escapingLink follows the directory path p inside root as the kernel
// would and returns the first symlink on it that is absolute or climbs
// above the root. It gives up quietly on anything missing or unreadable.
func escapingLink(root *os.Root, p string) (link, target string, ok bool) {
	todo := strings.Split(p, "/")
	resolved := ""
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		if c == "" || c == "." {
			continue
		}
		cur := path.Join(resolved, c)
		fi, err := root.Lstat(cur)
		if err != nil {
			return "", "", false
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = cur
			continue
		}
		if hops++; hops > 255 {
			return "", "", false
		}
		dest, err := root.Readlink(cur)
		if err != nil {
			return "", "", false
		}
		next := path.Join(resolved, dest)
		if path.IsAbs(dest) || next == ".." || strings.HasPrefix(next, "../") {
			return cur, dest, true
		}
		todo = append(strings.Split(next, "/"), todo...)
		resolved = ""
	}
	return "", "", false
}

// mode is the entry's ModeBits.
func mode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & ModeBits
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

// copyChunks copies r into f through buf, checking ctx between chunks.
func copyChunks(ctx context.Context, f *os.File, r io.Reader, buf []byte) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return StreamError(rerr)
		}
	}
}
