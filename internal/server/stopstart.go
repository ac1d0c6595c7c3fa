package server

import (
	"net/http"

	"github.com/corralrun/corral/internal/sandbox"
)

// StartSandboxRequest is the optional body of POST
// /v1/sandboxes/{id}/start: the new deadline is now + Timeout seconds
// (omitted: the server default; 0: no deadline, if allowed).
type StartSandboxRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

func (s *Server) stopStartRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/stop", s.stopSandbox},
		{"POST /v1/sandboxes/{id}/start", s.startSandbox},
	}
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Stop(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) {
	var req StartSandboxRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	var f fields
	timeout := f.seconds(sandbox.RangeTimeout, req.Timeout)
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	var sb sandbox.Sandbox
	var err error
	if timeout == nil {
		sb, err = s.m.StartSandbox(r.Context(), r.PathValue("id"))
	} else {
		sb, err = s.m.StartFor(r.Context(), r.PathValue("id"), *timeout)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}
