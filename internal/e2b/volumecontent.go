package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/wire"
)

// This file serves E2B's volume content API, with which the SDK's Volume
// reads and writes a volume's files without a sandbox:
//
//	GET    /volumecontent/{volumeID}/dir?path=P&depth=N   list
//	POST   /volumecontent/{volumeID}/dir?path=P&force=B   make a directory (force: with parents)
//	GET    /volumecontent/{volumeID}/path?path=P          stat
//	DELETE /volumecontent/{volumeID}/path?path=P          remove, recursively
//	GET    /volumecontent/{volumeID}/file?path=P          read
//	PUT    /volumecontent/{volumeID}/file?path=P          write the raw body (makes parents)
//
// A path is inside the volume ("/" or "" is its root; a relative path is
// taken from the root). Requests carry the volume's token
// (VolumeAndToken.token) as "Authorization: Bearer"; the daemon's API key
// is accepted too. Errors are E2B's {"code": "<HTTP status>", "message"}.

func (s *Server) routeVolumeContent() {
	mux := s.content
	mux.HandleFunc("GET /volumecontent/{volumeID}/dir", s.volumeCall(s.listVolumeDir))
	mux.HandleFunc("POST /volumecontent/{volumeID}/dir", s.volumeCall(s.makeVolumeDir))
	mux.HandleFunc("GET /volumecontent/{volumeID}/path", s.volumeCall(s.statVolumePath))
	mux.HandleFunc("DELETE /volumecontent/{volumeID}/path", s.volumeCall(s.removeVolumePath))
	mux.HandleFunc("PATCH /volumecontent/{volumeID}/path", s.volumeCall(func(w http.ResponseWriter, r *http.Request, _, _ string) {
		s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented,
			"changing the owner or mode of a volume's file is not supported by Corral: write the file again with a mode"))
	}))
	mux.HandleFunc("GET /volumecontent/{volumeID}/file", s.volumeCall(s.readVolumeFile))
	mux.HandleFunc("PUT /volumecontent/{volumeID}/file", s.volumeCall(s.writeVolumeFile))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no E2B volume content route for %s %s", r.Method, r.URL.Path))
	})
}

// volumeCall authenticates a volume content request and passes the
// handler the volume's name and the path inside it. A call that changes
// a file is recorded in the audit log, once authenticated
// (server.CallAudit).
func (s *Server) volumeCall(h func(w http.ResponseWriter, r *http.Request, name, p string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("volumeID")
		r, stop, ok := s.volumeAuth(r, name)
		defer stop()
		if !ok {
			s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated,
				"missing or invalid token for volume %s: send Authorization: Bearer with the token of Volume.create or Volume.getInfo", name))
			return
		}
		if s.vols == nil {
			s.writeVolumeError(w, r, errNoVolumes())
			return
		}
		call := func(w http.ResponseWriter, r *http.Request) { h(w, r, name, volumePath(r.URL.Query().Get("path"))) }
		calls := s.calls
		calls.Fail = s.writeVolumeError
		calls.Wrap(r.Pattern, callRecord(r.Pattern), call)(w, r)
	}
}

// volumeAuth authenticates a volume content request: by the volume's
// own token, or by an API key, whose principal then travels with the
// request so that the Manager answers not_found for another team's
// volume. stop is caller's.
func (s *Server) volumeAuth(r *http.Request, name string) (_ *http.Request, stop func(), ok bool) {
	if tok, ok := server.Credentials(r.Header, "Bearer"); ok && subtle.ConstantTimeCompare([]byte(tok), []byte(s.volumeToken(name))) == 1 {
		return r, func() {}, true
	}
	return s.caller(r)
}

// volumePath is p as the Manager's volume calls take it: absolute inside
// the volume, cleaned. The Manager keeps it inside the volume.
func volumePath(p string) string {
	return path.Join("/", p)
}

// writeVolumeError writes err in the volume content API's error shape. A
// write that runs out of space is 507, as on envd's /files: the 429 of
// resource_exhausted would make the SDK report a rate limit.
func (s *Server) writeVolumeError(w http.ResponseWriter, r *http.Request, err error) {
	err = s.redact(r, err)
	status := apiErrorOf(err).Code
	if errors.Is(err, errdefs.ErrResourceExhausted) && r.Method != http.MethodGet {
		status = http.StatusInsufficientStorage
	}
	wire.SetRetryAfter(w, err)
	writeJSON(w, status, struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{strconv.Itoa(status), err.Error()})
}

// volumeEntry is E2B's VolumeEntryStat. Corral keeps one time per file,
// the modification time, and reports it as all three.
type volumeEntry struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"` // file, directory, symlink or unknown
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

func volumeEntryOf(fi wire.FileInfo) volumeEntry {
	t := map[string]string{wire.FileTypeFile: "file", wire.FileTypeDir: "directory", wire.FileTypeSymlink: "symlink"}[fi.Type]
	if t == "" {
		t = "unknown"
	}
	return volumeEntry{Name: fi.Name, Path: fi.Path, Type: t, Size: fi.Size, Mode: fi.Mode, UID: uint32(fi.UID), GID: uint32(fi.GID),
		Atime: fi.ModTime, Mtime: fi.ModTime, Ctime: fi.ModTime, Target: fi.Target}
}

// listVolumeDir lists a directory to depth levels (default 1: its entries).
func (s *Server) listVolumeDir(w http.ResponseWriter, r *http.Request, name, p string) {
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid depth %q: want 1 or more", v))
			return
		}
		depth = n
	}
	list := func(ctx context.Context, dir string) ([]wire.FileInfo, error) {
		return s.vols.VolumeList(ctx, name, dir)
	}
	out := []volumeEntry{}
	if err := walkDir(r.Context(), list, p, depth, func(fi wire.FileInfo) { out = append(out, volumeEntryOf(fi)) }); err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeOptions reads the mode (decimal permission bits, def when absent)
// of a write or mkdir. uid and gid may only name 0: Corral writes a
// volume's files as the sandboxes' root and cannot give them other owners.
func writeOptions(r *http.Request, def fs.FileMode) (fs.FileMode, error) {
	q := r.URL.Query()
	for _, k := range []string{"uid", "gid"} {
		if v := q.Get(k); v != "" && v != "0" {
			return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %s is not supported by Corral: files written through the volume API belong to root (0)", k, v)
		}
	}
	v := q.Get("mode")
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n > 0o7777 {
		return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid mode %q: want permission bits, at most 4095 (0o7777)", v)
	}
	return fs.FileMode(n), nil
}

// makeVolumeDir creates a directory, with its parents when force is true.
func (s *Server) makeVolumeDir(w http.ResponseWriter, r *http.Request, name, p string) {
	mode, err := writeOptions(r, 0o755)
	if err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	parents, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	if err := s.vols.VolumeMkdir(r.Context(), name, p, parents, mode); err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	s.answerEntry(w, r, name, p, http.StatusCreated)
}

// answerEntry answers the entry at p of volume name with status.
func (s *Server) answerEntry(w http.ResponseWriter, r *http.Request, name, p string, status int) {
	fi, err := s.vols.VolumeStat(r.Context(), name, p)
	if err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	writeJSON(w, status, volumeEntryOf(fi))
}

func (s *Server) statVolumePath(w http.ResponseWriter, r *http.Request, name, p string) {
	s.answerEntry(w, r, name, p, http.StatusOK)
}

// removeVolumePath removes a file or a directory tree. A missing path is
// not_found (404), which the SDK reports as VolumePathNotFoundError; the
// root is refused, since removing it would remove the volume.
func (s *Server) removeVolumePath(w http.ResponseWriter, r *http.Request, name, p string) {
	if p == "/" {
		s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "the root of volume %s cannot be removed: remove its entries, or destroy the volume", name))
		return
	}
	if _, err := s.vols.VolumeStat(r.Context(), name, p); err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	if err := s.vols.VolumeRemove(r.Context(), name, p); err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readVolumeFile streams a file.
func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request, name, p string) {
	rc, size, err := s.vols.VolumeReadFile(r.Context(), name, p)
	if err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	sendFile(w, rc, size, p)
}

// writeVolumeFile writes the raw request body to a file, creating it and
// its parents or replacing it, as the SDK's writeFile documents; force is
// accepted and changes nothing.
func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request, name, p string) {
	if p == "/" {
		s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "a file path inside volume %s is required", name))
		return
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		s.writeVolumeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "upload encoding %q is not supported for volume files: send the raw content", enc))
		return
	}
	mode, err := writeOptions(r, 0o644)
	if err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	if err := s.vols.VolumeWriteFile(r.Context(), name, p, r.Body, mode); err != nil {
		s.writeVolumeError(w, r, err)
		return
	}
	s.answerEntry(w, r, name, p, http.StatusOK)
}
