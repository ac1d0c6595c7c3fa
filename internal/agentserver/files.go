package agentserver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/untar"
	"github.com/corralrun/corral/internal/wire"
)

// fileSystem is the sandbox's file tree as the file API sees it. Names are
// clean absolute sandbox paths.
type fileSystem interface {
	OpenFile(name string, flag int, perm os.FileMode) (*os.File, error)
	Lstat(name string) (os.FileInfo, error)
	Readlink(name string) (string, error)
	Mkdir(name string, perm os.FileMode) error
	MkdirAll(name string, perm os.FileMode) error
	Chmod(name string, mode os.FileMode) error
	Remove(name string) error
	RemoveAll(name string) error
	Rename(oldname, newname string) error
	// PinDir opens the directory name and returns a host path that the
	// kernel resolves to that very directory until release is called,
	// for APIs that take a path (inotify, the tar extractor). Under a
	// Root it is /proc/self/fd/N of a descriptor opened inside the root,
	// so a later swap of a path component for a symlink cannot redirect
	// it.
	PinDir(name string) (target string, release func(), err error)
}

// hostFS is the agent's own view. Inside a sandbox that is the sandbox's
// mount namespace, so no path can leave it, and absolute symbolic links
// (common in distribution trees) resolve as the sandbox's programs see them.
type hostFS struct{}

func (hostFS) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}
func (hostFS) Lstat(name string) (os.FileInfo, error)       { return os.Lstat(name) }
func (hostFS) Readlink(name string) (string, error)         { return os.Readlink(name) }
func (hostFS) Mkdir(name string, perm os.FileMode) error    { return os.Mkdir(name, perm) }
func (hostFS) MkdirAll(name string, perm os.FileMode) error { return os.MkdirAll(name, perm) }
func (hostFS) Chmod(name string, mode os.FileMode) error    { return os.Chmod(name, mode) }
func (hostFS) Remove(name string) error                     { return os.Remove(name) }
func (hostFS) RemoveAll(name string) error                  { return os.RemoveAll(name) }
func (hostFS) Rename(oldname, newname string) error         { return os.Rename(oldname, newname) }
func (hostFS) PinDir(name string) (string, func(), error) {
	fi, err := os.Stat(name)
	if err != nil {
		return "", nil, err
	}
	if !fi.IsDir() {
		return "", nil, syscall.ENOTDIR
	}
	return name, func() {}, nil
}

// rootFS confines every operation to a directory on the host with os.Root:
// ".." and symbolic links that would leave it fail.
type rootFS struct{ r *os.Root }

// rel turns a clean absolute sandbox path into a name relative to the root.
func rel(name string) string {
	if name == "/" {
		return "."
	}
	return strings.TrimPrefix(name, "/")
}

func (f rootFS) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	return f.r.OpenFile(rel(name), flag, perm)
}
func (f rootFS) Lstat(name string) (os.FileInfo, error)       { return f.r.Lstat(rel(name)) }
func (f rootFS) Readlink(name string) (string, error)         { return f.r.Readlink(rel(name)) }
func (f rootFS) Mkdir(name string, perm os.FileMode) error    { return f.r.Mkdir(rel(name), perm) }
func (f rootFS) MkdirAll(name string, perm os.FileMode) error { return f.r.MkdirAll(rel(name), perm) }
func (f rootFS) Chmod(name string, mode os.FileMode) error    { return f.r.Chmod(rel(name), mode) }
func (f rootFS) Remove(name string) error                     { return f.r.Remove(rel(name)) }
func (f rootFS) RemoveAll(name string) error                  { return f.r.RemoveAll(rel(name)) }
func (f rootFS) Rename(oldname, newname string) error {
	return f.r.Rename(rel(oldname), rel(newname))
}
func (f rootFS) PinDir(name string) (string, func(), error) {
	d, err := f.r.OpenFile(rel(name), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(int(d.Fd())), func() { d.Close() }, nil
}

// sandboxPath validates a path from a request and cleans it.
func sandboxPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", errorf(errdefs.ErrInvalidArgument, "path must be absolute: %q", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errorf(errdefs.ErrInvalidArgument, "path contains a NUL byte")
	}
	return path.Clean(p), nil
}

// fileRequest returns the file system and the cleaned ?path= of r.
func (s *Server) fileRequest(r *http.Request) (fileSystem, string, error) {
	fsys, err := s.files()
	if err != nil {
		return nil, "", err
	}
	p, err := sandboxPath(r.URL.Query().Get("path"))
	if err != nil {
		return nil, "", err
	}
	return fsys, p, nil
}

// handleReadFile serves GET /files: the file's bytes, streamed. Content
// length is set from the size when it is known (pseudo files report 0). A
// file whose first read fails gets an error response of the errno's kind;
// a later failure cuts the response short.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	// O_NONBLOCK keeps a FIFO from blocking the open; it is refused below.
	f, err := fsys.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		wire.WriteError(w, fsError("reading "+p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		wire.WriteError(w, fsError("reading "+p, err))
		return
	}
	if fi.IsDir() {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "reading %s: is a directory", p))
		return
	}
	if !fi.Mode().IsRegular() {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "reading %s: not a regular file", p))
		return
	}
	// The first read comes before the response starts, so that a file
	// that cannot be read at all (/proc/self/mem fails at offset 0) gets
	// its error; a cut connection would look like a lost agent, which is
	// worth retrying.
	size := fi.Size()
	first := make([]byte, min(max(size, 1), 4096))
	n, err := f.Read(first)
	if err != nil && err != io.EOF {
		wire.WriteError(w, fsError("reading "+p, err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if size > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	// A failed copy after the header cannot be reported as an error; the
	// connection is cut short of Content-Length (or of the final chunk) so
	// the client sees an unexpected EOF rather than a truncated file.
	if _, werr := w.Write(first[:n]); werr != nil {
		panic(http.ErrAbortHandler)
	}
	switch {
	case size > 0:
		_, err = io.CopyN(w, f, size-int64(n))
	case err == nil:
		_, err = io.Copy(w, f)
	default: // an empty file: io.EOF at once
		err = nil
	}
	if err != nil {
		panic(http.ErrAbortHandler)
	}
}

// handleWriteFile serves PUT /files: parents are created, the file is
// created or truncated, given exactly the mode (default 0644, regardless of
// umask), and filled from the body without buffering it.
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o644)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := fsys.MkdirAll(path.Dir(p), 0o755); err != nil {
		wire.WriteError(w, fsError("creating parent directories of "+p, notDirIfExists(err)))
		return
	}
	// os.Root creates only with permission bits; Chmod adds the rest.
	f, err := fsys.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, mode.Perm())
	if err != nil {
		wire.WriteError(w, fsError("writing "+p, err))
		return
	}
	info, err := writeFile(f, p, mode, r.Body)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fsError("writing "+p, cerr)
	}
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func writeFile(f *os.File, p string, mode os.FileMode, body io.Reader) (wire.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		return wire.FileInfo{}, fsError("writing "+p, err)
	}
	if !fi.Mode().IsRegular() {
		return wire.FileInfo{}, errorf(errdefs.ErrFailedPrecondition, "writing %s: not a regular file", p)
	}
	// The mode is set in two steps, each only when it changes: some files
	// can be written but not chmod'ed (cgroup control files in gVisor,
	// which the gVisor driver writes). The permissions come before the
	// contents, so that these are never readable more widely than asked;
	// setuid and setgid after them, as a tar upload sets them
	// (untar.SetFileMode).
	early := mode &^ (fs.ModeSetuid | fs.ModeSetgid)
	if fi.Mode()&untar.ModeBits != early&untar.ModeBits {
		if err := f.Chmod(early); err != nil {
			return wire.FileInfo{}, fsError("setting mode of "+p, err)
		}
	}
	if _, err := io.Copy(f, body); err != nil {
		return wire.FileInfo{}, fsError("writing "+p, err)
	}
	if fi, err = f.Stat(); err != nil {
		return wire.FileInfo{}, fsError("writing "+p, err)
	}
	if fi.Mode()&untar.ModeBits != mode&untar.ModeBits {
		if err := untar.SetFileMode(f, mode); err != nil {
			return wire.FileInfo{}, fsError("setting mode of "+p, err)
		}
		if fi, err = f.Stat(); err != nil {
			return wire.FileInfo{}, fsError("writing "+p, err)
		}
	}
	return fileInfo(p, fi, ""), nil
}

// handleRemove serves DELETE /files. A missing path is not_found even with
// recursive=true, so that a caller learns it removed nothing.
func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "invalid recursive value %q", v))
			return
		}
	}
	if p == "/" {
		wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "refusing to remove /"))
		return
	}
	if _, err := fsys.Lstat(p); err != nil {
		wire.WriteError(w, fsError("removing "+p, err))
		return
	}
	if recursive {
		err = fsys.RemoveAll(p)
	} else {
		err = fsys.Remove(p)
	}
	if err != nil {
		wire.WriteError(w, fsError("removing "+p, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleStat serves GET /files/stat. Symbolic links are not followed.
func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	info, err := stat(fsys, p)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func stat(fsys fileSystem, p string) (wire.FileInfo, error) {
	fi, err := fsys.Lstat(p)
	if err != nil {
		return wire.FileInfo{}, fsError("stat "+p, err)
	}
	target := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err = fsys.Readlink(p); err != nil {
			return wire.FileInfo{}, fsError("reading link "+p, err)
		}
	}
	return fileInfo(p, fi, target), nil
}

// handleList serves GET /files/list: the entries of a directory sorted by
// name, symbolic links not followed. Entries removed while listing are left
// out.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	f, err := fsys.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		wire.WriteError(w, fsError("listing "+p, err))
		return
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		wire.WriteError(w, fsError("listing "+p, err))
		return
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	out := make([]wire.FileInfo, 0, len(entries))
	for _, e := range entries {
		// Under os.Root, Info comes from fstatat on the directory, never
		// from a path that could be swapped for a link.
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			wire.WriteError(w, fsError("listing "+p, err))
			return
		}
		child := path.Join(p, e.Name())
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ = fsys.Readlink(child) // gone since: no target to show
		}
		out = append(out, fileInfo(child, fi, target))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleMkdir serves POST /files/mkdir. The directory gets exactly Mode
// (default 0755); with Parents an existing directory is fine and keeps its
// mode, and missing parents get 0755.
func (s *Server) handleMkdir(w http.ResponseWriter, r *http.Request) {
	fsys, err := s.files()
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	var req wire.MkdirRequest
	if err := decodeJSON(w, r, &req, 1<<20); err != nil {
		wire.WriteError(w, err)
		return
	}
	p, err := sandboxPath(req.Path)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	mode := os.FileMode(0o755)
	if req.Mode != 0 {
		if req.Mode > 0o7777 {
			wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "invalid mode %#o", req.Mode))
			return
		}
		mode = unixMode(req.Mode)
	}
	if req.Parents {
		if fi, err := fsys.Lstat(p); err == nil && fi.IsDir() {
			writeJSON(w, http.StatusOK, fileInfo(p, fi, ""))
			return
		}
		err = notDirIfExists(fsys.MkdirAll(p, mode.Perm()))
	} else {
		err = fsys.Mkdir(p, mode.Perm())
	}
	if err != nil {
		wire.WriteError(w, fsError("creating directory "+p, err))
		return
	}
	if err := fsys.Chmod(p, mode); err != nil {
		wire.WriteError(w, fsError("setting mode of "+p, err))
		return
	}
	info, err := stat(fsys, p)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// handleRename serves POST /files/rename with rename(2) semantics: an
// existing file at To is replaced, an empty directory too.
func (s *Server) handleRename(w http.ResponseWriter, r *http.Request) {
	fsys, err := s.files()
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	var req wire.RenameRequest
	if err := decodeJSON(w, r, &req, 1<<20); err != nil {
		wire.WriteError(w, err)
		return
	}
	from, err := sandboxPath(req.From)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	to, err := sandboxPath(req.To)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if from == "/" || to == "/" {
		wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "refusing to rename /"))
		return
	}
	if err := fsys.Rename(from, to); err != nil {
		// rename(2) reports a non-empty target directory as EEXIST or
		// ENOTEMPTY; both mean the same here.
		if errors.Is(err, syscall.EEXIST) {
			err = syscall.ENOTEMPTY
		}
		wire.WriteError(w, fsError(fmt.Sprintf("renaming %s to %s", from, to), err))
		return
	}
	info, err := stat(fsys, to)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// notDirIfExists turns the EEXIST of MkdirAll (a path component exists but
// is not a directory; os.Root reports it so) into ENOTDIR, which says what
// is wrong.
func notDirIfExists(err error) error {
	if errors.Is(err, fs.ErrExist) {
		return syscall.ENOTDIR
	}
	return err
}

// parseMode parses an octal permission string such as "0644" or "755".
func parseMode(s string, def os.FileMode) (os.FileMode, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, errorf(errdefs.ErrInvalidArgument, "invalid mode %q: want octal permission bits such as 0644", s)
	}
	return unixMode(uint32(n)), nil
}

// unixMode converts unix permission bits (with setuid, setgid and sticky)
// to an os.FileMode.
func unixMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// fileInfo describes fi, found at sandbox path p.
func fileInfo(p string, fi os.FileInfo, target string) wire.FileInfo {
	info := wire.FileInfo{
		Name:    path.Base(p),
		Path:    p,
		Type:    wire.FileTypeOther,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		ModTime: fi.ModTime().UTC(),
		Target:  target,
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = wire.FileTypeFile
	case fi.IsDir():
		info.Type = wire.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = wire.FileTypeSymlink
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
		info.UID, info.GID = int(st.Uid), int(st.Gid)
	}
	return info
}

// errPathEscapes is the text of os.Root's unexported error for a path
// that leaves the root; the standard library offers nothing to test with
// errors.Is, and os.Root nests it in different wrappers per operation.
const errPathEscapes = "path escapes from parent"

func isPathEscape(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == errPathEscapes {
			return true
		}
	}
	return false
}

// fsError turns a file system error into an errdefs error for the action
// ("reading /etc/hosts"). The message keeps the sandbox path and the
// reason, never a host path.
func fsError(action string, err error) error {
	kind := errdefs.ErrInternal
	reason := errnoText(err)
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		switch errno {
		case syscall.ENOENT:
			kind = errdefs.ErrNotFound
		case syscall.EEXIST:
			kind = errdefs.ErrAlreadyExists
		case syscall.EACCES, syscall.EPERM, syscall.EROFS:
			kind = errdefs.ErrPermissionDenied
		// EIO: the file cannot be read or written here (a pseudo file
		// such as /proc/self/mem, a failing disk); trying again does not
		// help.
		case syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY, syscall.EBUSY,
			syscall.EXDEV, syscall.ELOOP, syscall.ETXTBSY, syscall.ENXIO,
			syscall.EIO, syscall.EOPNOTSUPP:
			kind = errdefs.ErrFailedPrecondition
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EMLINK, syscall.EMFILE, syscall.ENFILE:
			kind = errdefs.ErrResourceExhausted
		case syscall.ENAMETOOLONG, syscall.EINVAL:
			kind = errdefs.ErrInvalidArgument
		}
	case isPathEscape(err):
		kind, reason = errdefs.ErrPermissionDenied, "path escapes the sandbox root"
	case errors.Is(err, os.ErrClosed): // Close released Root under us
		kind, reason = errdefs.ErrUnavailable, "agent is shutting down"
	case errors.Is(err, fs.ErrNotExist):
		kind = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrExist):
		kind = errdefs.ErrAlreadyExists
	case errors.Is(err, fs.ErrPermission):
		kind = errdefs.ErrPermissionDenied
	}
	return errorf(kind, "%s: %s", action, reason)
}

// errnoText is the reason an OS error gives, without the operations and
// paths that *PathError and *LinkError add: under Root those name host
// paths.
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	for {
		inner := errors.Unwrap(err)
		if inner == nil {
			return err.Error()
		}
		err = inner
	}
}
