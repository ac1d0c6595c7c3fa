package agentserver

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/untar"
	"github.com/corralrun/corral/internal/wire"
)

// handleReadArchive serves GET /files/archive?path=P: a tar stream of P.
// A directory yields its contents with names relative to it (directories
// end in "/"); a file yields one entry named by its base name. A symbolic
// link at P itself is followed (inside Root); links below it are archived
// as links.
//
// Entries: regular files, directories and symbolic links, with mode
// (including setuid, setgid, sticky), uid, gid and modification time
// (whole seconds). Hard links are archived as separate files; sockets,
// FIFOs and devices are left out, and so is anything that vanishes during
// the walk. A file that shrinks while it is read is padded with zeros to
// the size its header announced; one that grows is cut at that size.
//
// Safety and cost: below P the walk never resolves a path; every step is
// relative to an open directory and refuses to follow symbolic links
// (openat with O_NOFOLLOW), so neither a link nor a concurrent rename can
// lead it outside P. Contents stream through a 128 KiB buffer; only the
// names of the directory being read are held, plus one descriptor per
// level of depth. A failure after the first byte cuts the response short,
// so the client's tar reader reports an unexpected EOF.
func (s *Server) handleReadArchive(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	f, err := fsys.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		wire.WriteError(w, fsError("archiving "+p, err))
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if err := fstat(f, &st); err != nil {
		wire.WriteError(w, fsError("archiving "+p, err))
		return
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !isDir && st.Mode&unix.S_IFMT != unix.S_IFREG {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "archiving %s: not a regular file or directory", p))
		return
	}

	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	a := &archiver{tw: tar.NewWriter(w), buf: make([]byte, 128<<10)}
	if isDir {
		err = a.dir(r.Context(), f, "")
	} else {
		name := path.Base(p)
		if name == "/" {
			name = "file"
		}
		err = a.file(f, name, &st)
	}
	if err == nil {
		err = a.tw.Close()
	}
	if err != nil {
		panic(http.ErrAbortHandler)
	}
}

// archiver writes one tar stream.
type archiver struct {
	tw  *tar.Writer
	buf []byte
}

// dir archives the entries of the open directory d under prefix ("" or
// ending in "/").
func (a *archiver) dir(ctx context.Context, d *os.File, prefix string) error {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		var entryErr error
		if err := rc.Control(func(dfd uintptr) { entryErr = a.entry(ctx, int(dfd), name, prefix) }); err != nil {
			return err
		}
		if entryErr != nil {
			return entryErr
		}
	}
	return nil
}

// gone reports errors that mean an entry vanished or changed type since
// it was listed; the walk skips it.
func gone(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP)
}

// entry archives the entry name of the directory dfd.
func (a *archiver) entry(ctx context.Context, dfd int, name, prefix string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if gone(err) {
			return nil
		}
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		sub := os.NewFile(uintptr(fd), name)
		defer sub.Close()
		if err := fstat(sub, &st); err != nil {
			return err
		}
		hdr := header(prefix+name+"/", &st)
		hdr.Typeflag = tar.TypeDir
		if err := a.tw.WriteHeader(hdr); err != nil {
			return err
		}
		return a.dir(ctx, sub, prefix+name+"/")
	case unix.S_IFREG:
		// O_NONBLOCK: should it have become a FIFO meanwhile, the open
		// does not wait for a writer, and the type check below skips it.
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if err := fstat(f, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil
		}
		return a.file(f, prefix+name, &st)
	case unix.S_IFLNK:
		target, err := readlinkat(dfd, name)
		if err != nil {
			if gone(err) || errors.Is(err, syscall.EINVAL) {
				return nil
			}
			return err
		}
		hdr := header(prefix+name, &st)
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
		return a.tw.WriteHeader(hdr)
	default:
		return nil
	}
}

// file archives the open regular file f, whose status is st, as name.
func (a *archiver) file(f *os.File, name string, st *unix.Stat_t) error {
	hdr := header(name, st)
	hdr.Typeflag = tar.TypeReg
	hdr.Size = st.Size
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(a.tw, io.LimitReader(f, st.Size), a.buf)
	if err != nil {
		return err
	}
	// Shrunk since the header was written: pad to the announced size.
	for n < st.Size {
		clear(a.buf)
		m, err := a.tw.Write(a.buf[:min(int64(len(a.buf)), st.Size-n)])
		if err != nil {
			return err
		}
		n += int64(m)
	}
	return nil
}

// header returns a tar header with the metadata common to every type.
// The format is left to the writer (USTAR when it fits, else PAX), which
// rounds times to seconds.
func header(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
}

func fstat(f *os.File, st *unix.Stat_t) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var statErr error
	if err := rc.Control(func(fd uintptr) { statErr = unix.Fstat(int(fd), st) }); err != nil {
		return err
	}
	return statErr
}

// readlinkat reads the target of the symbolic link name in dfd.
func readlinkat(dfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// handleWriteArchive serves PUT /files/archive?path=P: the tar in the body
// (plain or gzip) is extracted into directory P, which is created with
// its parents (0755) if missing. Names are relative to P; an entry that
// would land outside it stops the extraction with invalid_argument naming
// the entry: an absolute name or hard link target (refused here, although
// the extractor would strip the slash, because in an upload it almost
// always means a path on the client's machine), a name that climbs out
// with "..", a path through a symbolic link pointing outside P (or any
// absolute one), a hard link to outside P. Entries before the refused one
// stay in place.
//
// Extraction is untar.ExtractTar on the directory pinned inside the
// file system (see fileSystem.PinDir), fed through a screen that checks
// names: one extra goroutine and copy per upload, nothing buffered whole.
func (s *Server) handleWriteArchive(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := fsys.MkdirAll(p, 0o755); err != nil {
		wire.WriteError(w, fsError("creating directory "+p, notDirIfExists(err)))
		return
	}
	dir, release, err := fsys.PinDir(p)
	if err != nil {
		wire.WriteError(w, fsError("extracting archive into "+p, err))
		return
	}
	defer release()

	pr, pw := io.Pipe()
	screened := make(chan error, 1)
	go func() {
		err := screenTar(r.Body, pw)
		pw.CloseWithError(err)
		screened <- err
	}()
	err = untar.ExtractTar(r.Context(), pr, dir)
	pr.CloseWithError(errExtractStopped) // the screen stops at its next write
	if err != nil {
		interruptBody(w, drainWait)
	}
	if serr := <-screened; serr != nil && !errors.Is(serr, errExtractStopped) {
		err = serr // the screen's refusal is why extraction ended
	}
	if err != nil {
		// The rest of the archive is read and dropped, for a moment, so
		// that a client still sending it gets to read the refusal instead
		// of a connection reset under its write.
		_, _ = io.Copy(io.Discard, r.Body)
		wire.WriteError(w, extractError(p, dir, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// interruptBody ends reads of the request body after wait, so that one
// waiting for a client who sends nothing returns: the connection's read
// deadline passes. The connection is closed after the response, since
// its state is unknown.
func interruptBody(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(wait))
}

// drainWait bounds how long a refused upload's remaining body is read
// before the refusal is sent.
const drainWait = 2 * time.Second

// errExtractStopped tells the screen that the extractor stopped reading.
var errExtractStopped = errors.New("extraction stopped")

// screenTar copies the tar stream in r (decompressing gzip) to w entry by
// entry, and stops with invalid_argument at the first entry whose name or
// hard link target is absolute.
func screenTar(r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errorf(errdefs.ErrInvalidArgument, "reading gzip header of archive: %v", err)
		}
		src = zr
	}
	tr := tar.NewReader(src)
	tw := tar.NewWriter(w)
	buf := make([]byte, 64<<10)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		// ErrInsecurePath comes with a usable header; judging names is
		// this function's and the extractor's job.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return errorf(errdefs.ErrInvalidArgument, "reading archive: %v", err)
		}
		if strings.HasPrefix(hdr.Name, "/") {
			return errorf(errdefs.ErrInvalidArgument, "extracting entry %q: absolute names are not allowed", hdr.Name)
		}
		if hdr.Typeflag == tar.TypeLink && strings.HasPrefix(hdr.Linkname, "/") {
			return errorf(errdefs.ErrInvalidArgument, "extracting entry %q: hard link target %q is absolute", hdr.Name, hdr.Linkname)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return screenWriteError(err)
		}
		if _, err := io.CopyBuffer(tw, tr, buf); err != nil {
			if errors.Is(err, errExtractStopped) {
				return err
			}
			// The writer takes exactly what the reader yields, so this
			// is the body failing.
			return errorf(errdefs.ErrInvalidArgument, "reading archive entry %q: %v", hdr.Name, err)
		}
	}
	return screenWriteError(tw.Close())
}

// screenWriteError passes on the extractor stopping; other write errors
// are the tar writer refusing a header it cannot reproduce.
func screenWriteError(err error) error {
	if err == nil || errors.Is(err, errExtractStopped) {
		return err
	}
	return errorf(errdefs.ErrInvalidArgument, "re-encoding archive: %v", err)
}

// extractError keeps the kind ExtractTar gave err (or derives one from the
// errno) and the name of the entry at fault, and shows the sandbox path
// where the message would name the pinned host path.
func extractError(p, dir string, err error) error {
	msg := strings.ReplaceAll(err.Error(), dir, p)
	// FromCode and fsError both return errors that unwrap to their kind.
	kind := errors.Unwrap(errdefs.FromCode(errdefs.Code(err), ""))
	if kind == errdefs.ErrInternal {
		kind = errors.Unwrap(fsError("", err))
	}
	return errorf(kind, "extracting archive into %s: %s", p, msg)
}
