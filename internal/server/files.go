package server

import (
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// fileOp is the part of a file handler that runs once the sandbox's agent
// and the path are known; it returns the JSON answer, or nil when it wrote
// the response itself.
type fileOp func(ag *agentclient.Client, path string) (any, error)

// files resolves the running sandbox's agent and, when needPath is set, the
// required path query parameter, then runs op and writes its result as JSON
// (status 200) or its error.
func (s *Server) files(needPath bool, op fileOp) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if needPath && p == "" {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter path is required"))
			return
		}
		ag, err := s.m.Agent(r.Context(), r.PathValue("id"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out, err := op(ag, p)
		switch {
		case err != nil:
			s.writeError(w, r, err)
		case out != nil:
			writeJSON(w, http.StatusOK, out)
		}
	}
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		body, size, err := ag.ReadFile(r.Context(), p)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		if size >= 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		}
		w.WriteHeader(http.StatusOK)
		// A failure midway cuts the response short, so that a file of
		// unknown size never looks complete.
		if _, err := io.Copy(w, body); err != nil {
			panic(http.ErrAbortHandler)
		}
		return nil, nil
	})(w, r)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || sandbox.RangeFileMode.Check(int64(v)) != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "mode %q must be octal permission bits like 0644", m))
			return
		}
		mode = fileMode(uint32(v))
	}
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		return ag.WriteFile(r.Context(), p, mode, r.Body)
	})(w, r)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		if err := ag.Remove(r.Context(), p, r.URL.Query().Get("recursive") == "true"); err != nil {
			return nil, err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil, nil
	})(w, r)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) { return ag.Stat(r.Context(), p) })(w, r)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		list, err := ag.List(r.Context(), p)
		if list == nil && err == nil {
			list = []wire.FileInfo{}
		}
		return list, err
	})(w, r)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req wire.MkdirRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := sandbox.RangeFileMode.Check(int64(req.Mode)); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.files(false, func(ag *agentclient.Client, _ string) (any, error) { return ag.Mkdir(r.Context(), req) })(w, r)
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request) {
	var req wire.RenameRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.files(false, func(ag *agentclient.Client, _ string) (any, error) { return ag.Rename(r.Context(), req.From, req.To) })(w, r)
}

// fileMode converts Unix permission bits (as in the mode query parameter)
// to Go's os.FileMode, whose setuid, setgid and sticky bits differ.
func fileMode(v uint32) os.FileMode {
	m := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}
