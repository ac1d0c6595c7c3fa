package template

import (
	"archive/tar"
	"bufio"
	"bytes"
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

// ExtractTar unpacks the rootfs tarball read from r into dir, creating dir
// if it does not exist. The tarball may be plain or gzip-compressed; the
// format is detected from its first bytes. zstd, xz and bzip2 are refused
// with an error wrapping errdefs.ErrNotImplemented (the standard library has
// no compressor for the first two and none of them is worth a dependency
// yet: decompress first).
//
// Path safety: every write goes through an os.Root opened on dir, so no
// entry can create, change or remove anything outside dir.
//   - Leading slashes are stripped (tarballs made with `tar -C / ...` have
//     them); a name that still leaves dir after cleaning ("x/../../y") is
//     refused.
//   - An entry whose path runs through a symlink that points outside dir,
//     or through any absolute symlink (os.Root does not follow those), is
//     refused and the import stops: an archive that does this is either
//     hostile or broken, and refusing is easier to reason about than
//     rewriting where it lands.
//   - Symlink contents are stored as they are: an absolute target like
//     /usr/bin/python3 resolves inside the sandbox, not on the host.
//   - A hard link's target is an archive member name and must lie in dir.
//
// Errors name the entry and wrap errdefs.ErrInvalidArgument when the
// archive is at fault (escapes, malformed or truncated data, unsupported
// entry types), for example
// `extracting entry "x/../../y": path escapes the rootfs: invalid argument`.
//
// Entries are applied in order and a later entry replaces an earlier one
// of the same name (a directory merges into an existing directory).
// Regular files, directories, symlinks and hard links are created;
// character and block devices and FIFOs are skipped, because the runtime
// provides /dev. Modes keep setuid, setgid and sticky bits; ownership
// (uid/gid as numbers) is applied when running as root, as tar does;
// modification times are applied to files and directories but not to
// symlinks (os.Root cannot set them without following the link). Extended
// attributes (file capabilities) are not applied. Whiteout files
// (".wh.*") are ordinary files here.
//
// Sparse entries (GNU tar --sparse) are refused: the archive format lets a
// few bytes claim terabytes of zeros.
//
// Cost: one pass over the stream with a fixed 128 KiB copy buffer; file
// contents are never held in memory, and the tree written is never larger
// than the stream's data. Memory grows only with the number of directories,
// whose modes and times are applied at the end so that read-only
// directories can still be filled. On error dir holds a partial tree that
// the caller removes. ctx is checked between entries and between chunks of
// a file. ExtractTar reads r to its end but does not close it. Concurrent calls on different dirs
// are safe.
func ExtractTar(ctx context.Context, r io.Reader, dir string) error {
	src, err := decompress(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating rootfs directory: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening rootfs directory: %w", err)
	}
	defer root.Close()

	x := &extractor{root: root, chown: os.Geteuid() == 0, buf: make([]byte, 128<<10)}
	tr := tar.NewReader(src)
	last := ""
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("extracting tarball into %s: %w", dir, err)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		// Next reports ErrInsecurePath along with a usable header when the
		// tarinsecurepath GODEBUG asks for it; our own checks are stricter,
		// so the header is processed as usual.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			if last == "" {
				return fmt.Errorf("reading tarball: %w", streamError(err))
			}
			return fmt.Errorf("reading tarball after entry %q: %w", last, streamError(err))
		}
		last = hdr.Name
		if err := x.entry(ctx, hdr, tr); err != nil {
			return fmt.Errorf("extracting entry %q: %w", hdr.Name, err)
		}
	}
	// Read to the end: the gzip checksum comes last, and a caller that
	// verifies a digest of r needs all of it consumed.
	if _, err := io.CopyBuffer(io.Discard, src, x.buf); err != nil {
		return fmt.Errorf("reading the end of the tarball: %w", streamError(err))
	}
	return x.finishDirs()
}

// Magic numbers at the start of compressed streams.
var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicBzip2 = []byte("BZh")
)

// decompress returns a reader of the tar stream inside r.
func decompress(r io.Reader) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	// A short or empty stream is left to the tar reader to judge.
	head, err := br.Peek(len(magicXz))
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("reading tarball: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, magicGzip):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("reading gzip header of tarball: %w", streamError(err))
		}
		return zr, nil
	case bytes.HasPrefix(head, magicZstd):
		return nil, unsupportedCompression("zstd")
	case bytes.HasPrefix(head, magicXz):
		return nil, unsupportedCompression("xz")
	case bytes.HasPrefix(head, magicBzip2):
		return nil, unsupportedCompression("bzip2")
	}
	return br, nil
}

func unsupportedCompression(name string) error {
	return fmt.Errorf("%s-compressed tarballs are not supported, only plain and gzip: decompress it first: %w", name, errdefs.ErrNotImplemented)
}

// streamError marks errors that mean the archive itself is malformed or
// truncated as invalid arguments; errors of the underlying reader pass
// through unchanged.
func streamError(err error) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// extractor holds the state of one ExtractTar call.
type extractor struct {
	root  *os.Root
	chown bool
	buf   []byte
	// dirs records directory metadata, applied by finishDirs once every
	// entry is in place.
	dirs []dirMeta
}

type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

func errEscape() error {
	return fmt.Errorf("path escapes the rootfs: %w", errdefs.ErrInvalidArgument)
}

// cleanName turns an archive member name into a clean path relative to the
// root: "." for the root itself, never starting with "..".
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

// entry applies one archive entry.
func (x *extractor) entry(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	var target string
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = x.dir(name, hdr)
	case tar.TypeReg, tar.TypeCont:
		if isSparse(hdr) {
			return fmt.Errorf("sparse files are not supported: %w", errdefs.ErrInvalidArgument)
		}
		err = x.file(ctx, name, hdr, tr)
	case tar.TypeGNUSparse:
		return fmt.Errorf("sparse files are not supported: %w", errdefs.ErrInvalidArgument)
	case tar.TypeSymlink:
		err = x.symlink(name, hdr)
	case tar.TypeLink:
		if target, err = cleanName(hdr.Linkname); err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		err = x.hardlink(name, target)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil
	default:
		return fmt.Errorf("unsupported entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	if err == nil || errors.Is(err, errdefs.ErrInvalidArgument) {
		return err
	}
	// os.Root's refusal to follow a symlink out of the root is not an
	// exported error, so find the link ourselves to say which one it was.
	// Safety never depends on this walk; only the message and kind do.
	for _, p := range []string{name, target} {
		if p == "" {
			continue
		}
		if link, dest, ok := x.escapingLink(path.Dir(p)); ok {
			return fmt.Errorf("path escapes the rootfs through symlink %q -> %q: %w", link, dest, errdefs.ErrInvalidArgument)
		}
	}
	return err
}

func errReplaceRoot() error {
	return fmt.Errorf("entry would replace the rootfs directory itself: %w", errdefs.ErrInvalidArgument)
}

// prepare makes the parent directories of name and removes whatever is at
// name, unless both it and the new entry are directories. It reports
// whether a directory was kept.
func (x *extractor) prepare(name string, isDir bool) (kept bool, err error) {
	if d := path.Dir(name); d != "." {
		if err := x.root.MkdirAll(d, 0o755); err != nil {
			return false, err
		}
	}
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if isDir && fi.IsDir() {
		return true, nil
	}
	return false, x.root.RemoveAll(name)
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	if name != "." {
		kept, err := x.prepare(name, true)
		if err != nil {
			return err
		}
		if !kept {
			// Owner-only until finishDirs applies the real mode.
			if err := x.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
	}
	if x.chown {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.dirs = append(x.dirs, dirMeta{name: name, mode: mode(hdr), atime: atime(hdr), mtime: hdr.ModTime})
	return nil
}

func (x *extractor) file(ctx context.Context, name string, hdr *tar.Header, tr *tar.Reader) error {
	if name == "." {
		return errReplaceRoot()
	}
	if _, err := x.prepare(name, false); err != nil {
		return err
	}
	// O_EXCL: prepare removed the old entry, so nothing at name is followed.
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := x.fill(ctx, f, hdr, tr); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return x.root.Chtimes(name, atime(hdr), hdr.ModTime)
}

// fill copies the entry's contents into f and sets owner and mode through
// the open descriptor. Owner comes first because chown clears setuid bits.
func (x *extractor) fill(ctx context.Context, f *os.File, hdr *tar.Header, tr *tar.Reader) error {
	if err := copyChunks(ctx, f, tr, x.buf); err != nil {
		return err
	}
	if x.chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	return f.Chmod(mode(hdr))
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return errReplaceRoot()
	}
	if hdr.Linkname == "" {
		return fmt.Errorf("symlink has an empty target: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := x.prepare(name, false); err != nil {
		return err
	}
	if err := x.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	if x.chown {
		return x.root.Lchown(name, hdr.Uid, hdr.Gid)
	}
	return nil
}

func (x *extractor) hardlink(name, target string) error {
	if name == "." {
		return errReplaceRoot()
	}
	if name == target {
		return nil // a link to itself is already in place
	}
	if _, err := x.prepare(name, false); err != nil {
		return err
	}
	return x.root.Link(target, name)
}

// finishDirs applies directory modes and times, in archive order so that a
// later entry for the same directory wins.
func (x *extractor) finishDirs() error {
	for _, d := range x.dirs {
		// A later entry may have replaced the directory; its own metadata
		// is already in place.
		if fi, err := x.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		if err := x.root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("setting mode of directory %q: %w", d.name, err)
		}
		if err := x.root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return fmt.Errorf("setting times of directory %q: %w", d.name, err)
		}
	}
	return nil
}

// escapingLink walks the directory path p inside the root the way the
// kernel would and returns the first symlink on it that is absolute or
// leads above the root. It stops quietly at anything missing or unreadable.
func (x *extractor) escapingLink(p string) (link, target string, ok bool) {
	todo := strings.Split(p, "/")
	var done []string
	for links := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		if c == "." || c == "" {
			continue
		}
		cur := path.Join(path.Join(done...), c)
		fi, err := x.root.Lstat(cur)
		if err != nil {
			return "", "", false
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if links++; links > 255 {
			return "", "", false
		}
		dest, err := x.root.Readlink(cur)
		if err != nil {
			return "", "", false
		}
		if path.IsAbs(dest) {
			return cur, dest, true
		}
		next := path.Join(path.Join(done...), dest)
		if next == ".." || strings.HasPrefix(next, "../") {
			return cur, dest, true
		}
		todo = append(strings.Split(next, "/"), todo...)
		done = done[:0]
	}
	return "", "", false
}

// isSparse reports whether hdr is a PAX-format GNU sparse file. The tar
// reader fills holes with zeros, so a few bytes of archive could claim
// terabytes of file; rootfs tarballs do not use sparse entries (GNU tar
// makes them only with --sparse, image builders never).
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
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
			return streamError(rerr)
		}
	}
}
