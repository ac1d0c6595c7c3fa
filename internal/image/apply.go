package image

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

// Whiteout names, from the OCI image spec (image-layer, "Whiteouts"):
// "A whiteout file is an empty file with a special filename that signifies
// a path should be deleted. A whiteout filename consists of the prefix
// .wh. plus the basename of the path to be deleted." and "An opaque
// whiteout entry is a file with the name .wh..wh..opq indicating that all
// siblings are hidden in the lower layer."
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// applier applies one layer's tar stream onto a tree. All writes, removals
// and lookups go through root, so no entry can reach outside the tree,
// whatever the names, symlinks and hard links in this or earlier layers.
type applier struct {
	root  *os.Root
	chown bool
	buf   []byte
	// dirs records directory metadata, applied once the layer is in place
	// so that read-only directories can still be filled.
	dirs []dirMeta
	// mine holds every path this layer has written, with its ancestors.
	// The spec says "Whiteout files MUST only apply to resources in
	// lower/parent layers. Files that are present in the same layer as a
	// whiteout file can only be hidden by whiteout files in subsequent
	// layers", and layers are not required to put whiteouts first, so a
	// whiteout or opaque marker removes only what this set does not hold.
	mine map[string]bool
}

type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

// applyLayer applies the uncompressed layer tar read from r onto the tree
// opened as root: entries in order, later ones replacing earlier ones of
// the same name, whiteouts deleting what lower layers left. buf is the copy
// buffer. It reads r to the end of the tar stream. Errors name the entry
// and wrap errdefs.ErrInvalidArgument when the layer is at fault.
func applyLayer(ctx context.Context, root *os.Root, r io.Reader, buf []byte) error {
	a := &applier{root: root, chown: os.Geteuid() == 0, buf: buf, mine: make(map[string]bool)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		// Our own name checks are stricter than tar.ErrInsecurePath, so a
		// header that comes with it is processed as usual.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("reading layer: %w", streamError(err))
		}
		if err := a.entry(ctx, hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	return a.finishDirs()
}

func errEscape() error {
	return fmt.Errorf("path escapes the rootfs: %w", errdefs.ErrInvalidArgument)
}

// streamError marks a malformed or truncated archive as an invalid
// argument; errors of the underlying reader pass through unchanged.
func streamError(err error) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// cleanName turns an archive member name into a clean path relative to the
// root: "." for the root itself, never leading above it.
//
// Leading slashes are dropped (layers made with `tar -C / ...` have them);
// a name that still climbs above the root after cleaning ("a/../../b") is
// refused rather than clamped: a layer that names such a path is broken or
// hostile.
func cleanName(name string) (string, error) {
	n := strings.TrimLeft(name, "/")
	if n == "" {
		return ".", nil
	}
	n = path.Clean(n)
	if n == ".." || strings.HasPrefix(n, "../") {
		return "", errEscape()
	}
	return n, nil
}

func (a *applier) entry(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if strings.HasPrefix(name, whiteoutMeta) {
		// AUFS keeps its bookkeeping (hard link directories) under
		// ".wh..wh.*" at the top; the spec reserves the prefix and it is
		// not part of the filesystem.
		return nil
	}
	if dir, base := path.Dir(name), path.Base(name); strings.HasPrefix(base, whiteoutPrefix) {
		return a.classify(a.whiteout(dir, base), name)
	}
	var target string
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = a.dir(name, hdr)
	case tar.TypeReg, tar.TypeCont:
		err = a.file(ctx, name, hdr, tr)
	case tar.TypeSymlink:
		err = a.symlink(name, hdr)
	case tar.TypeLink:
		if target, err = cleanName(hdr.Linkname); err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		err = a.hardlink(name, target)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// The runtime provides /dev; device nodes in images are skipped.
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeGNUSparse:
		return fmt.Errorf("sparse files are not supported: %w", errdefs.ErrInvalidArgument)
	default:
		return fmt.Errorf("unsupported entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return a.classify(err, name, target)
	}
	a.mark(name)
	return nil
}

// classify turns a refusal of os.Root to leave the tree into an error that
// names the symlink and wraps errdefs.ErrInvalidArgument. os.Root's own
// error is not exported, so the link is found by walking the paths the
// entry touched; safety never depends on this walk, only the message does.
func (a *applier) classify(err error, paths ...string) error {
	if err == nil || errors.Is(err, errdefs.ErrInvalidArgument) {
		return err
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if link, dest, ok := escapingLink(a.root, path.Dir(p)); ok {
			return fmt.Errorf("path escapes the rootfs through symlink %q -> %q: %w", link, dest, errdefs.ErrInvalidArgument)
		}
	}
	return err
}

// mark records that this layer wrote name, and so its ancestors.
func (a *applier) mark(name string) {
	for name != "." && !a.mine[name] {
		a.mine[name] = true
		name = path.Dir(name)
	}
}

// whiteout handles an entry named dir/base where base starts with ".wh.".
func (a *applier) whiteout(dir, base string) error {
	switch {
	case base == whiteoutOpaque:
		return a.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta):
		// Other ".wh..wh." names are reserved and hide nothing.
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return fmt.Errorf("whiteout names no file: %w", errdefs.ErrInvalidArgument)
	}
	return a.removeLower(path.Join(dir, victim))
}

// opaque hides everything lower layers put in dir.
func (a *applier) opaque(dir string) error {
	fi, err := a.root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return a.removeLowerChildren(dir)
	}
	if a.mine[dir] {
		return fmt.Errorf("opaque marker inside %q, which this layer made a non-directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	// A lower non-directory stands where this layer has a directory: the
	// directory entry itself may come later in the stream.
	return a.root.RemoveAll(dir)
}

// removeLower deletes p as far as lower layers made it: entirely when this
// layer has not written p, otherwise only the lower parts of a directory.
func (a *applier) removeLower(p string) error {
	if !a.mine[p] {
		return a.root.RemoveAll(p)
	}
	fi, err := a.root.Lstat(p)
	if err != nil || !fi.IsDir() {
		return nil
	}
	return a.removeLowerChildren(p)
}

func (a *applier) removeLowerChildren(dir string) error {
	f, err := a.root.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := a.removeLower(path.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

func errReplaceRoot() error {
	return fmt.Errorf("entry would replace the rootfs directory itself: %w", errdefs.ErrInvalidArgument)
}

// prepare makes the parent directories of name and removes whatever is at
// name, unless both it and the new entry are directories. It reports
// whether a directory was kept.
func (a *applier) prepare(name string, isDir bool) (kept bool, err error) {
	if d := path.Dir(name); d != "." {
		if err := a.root.MkdirAll(d, 0o755); err != nil {
			return false, err
		}
	}
	fi, err := a.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if isDir && fi.IsDir() {
		return true, nil
	}
	return false, a.root.RemoveAll(name)
}

func (a *applier) dir(name string, hdr *tar.Header) error {
	if name != "." {
		kept, err := a.prepare(name, true)
		if err != nil {
			return err
		}
		if !kept {
			// Owner-only until finishDirs applies the real mode.
			if err := a.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
	}
	if a.chown {
		if err := a.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	a.dirs = append(a.dirs, dirMeta{name: name, mode: mode(hdr), atime: atime(hdr), mtime: hdr.ModTime})
	return nil
}

func (a *applier) file(ctx context.Context, name string, hdr *tar.Header, tr *tar.Reader) error {
	if name == "." {
		return errReplaceRoot()
	}
	for k := range hdr.PAXRecords {
		// The tar reader fills holes of PAX sparse files with zeros, so a
		// few bytes of layer could claim terabytes of file.
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("sparse files are not supported: %w", errdefs.ErrInvalidArgument)
		}
	}
	if _, err := a.prepare(name, false); err != nil {
		return err
	}
	// O_EXCL: prepare removed the old entry, so nothing at name is followed.
	f, err := a.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := copyChunks(ctx, f, tr, a.buf); err != nil {
		f.Close()
		return err
	}
	// Owner first: chown clears setuid and setgid bits.
	if a.chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Chmod(mode(hdr)); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return a.root.Chtimes(name, atime(hdr), hdr.ModTime)
}

func (a *applier) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return errReplaceRoot()
	}
	if hdr.Linkname == "" {
		return fmt.Errorf("symlink has an empty target: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := a.prepare(name, false); err != nil {
		return err
	}
	// The target is stored as it is: an absolute target resolves inside
	// the sandbox, never on the host, because nothing here follows it.
	if err := a.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	if a.chown {
		return a.root.Lchown(name, hdr.Uid, hdr.Gid)
	}
	return nil
}

func (a *applier) hardlink(name, target string) error {
	if name == "." {
		return errReplaceRoot()
	}
	if name == target {
		return nil
	}
	if _, err := a.prepare(name, false); err != nil {
		return err
	}
	return a.root.Link(target, name)
}

// finishDirs applies directory modes and times in archive order, so a
// later entry for the same directory wins.
func (a *applier) finishDirs() error {
	for _, d := range a.dirs {
		// A later entry or whiteout may have replaced the directory.
		if fi, err := a.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		if err := a.root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("setting mode of directory %q: %w", d.name, err)
		}
		if err := a.root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return fmt.Errorf("setting times of directory %q: %w", d.name, err)
		}
	}
	return nil
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

// mode is the entry's permission bits including setuid, setgid and sticky.
func mode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

// copyChunks copies r into w through buf, checking ctx between chunks.
func copyChunks(ctx context.Context, w io.Writer, r io.Reader, buf []byte) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return streamError(rerr)
		}
	}
}
