package server

import (
	"net/http"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	spec, err := req.spec()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.m.Create(r.Context(), spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewOf(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	var f sandbox.Filter
	q := r.URL.Query()
	if st := q.Get("state"); st != "" {
		state, err := sandbox.ParseState(st)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		f.State = state
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata filter %q must be KEY=VALUE", kv))
			return
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	writeJSON(w, http.StatusOK, views(s.m.List(r.Context(), f), viewOf))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Delete(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req TimeoutRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Timeout == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout (seconds) is required"))
		return
	}
	var f fields
	timeout := f.seconds(sandbox.RangeTimeout, req.Timeout)
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	sb, err := s.m.SetTimeout(r.Context(), r.PathValue("id"), *timeout)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}
