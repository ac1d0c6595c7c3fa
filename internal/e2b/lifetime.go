package e2b

import (
	"context"
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// This file serves the calls of E2B's control plane that change a
// sandbox's lifetime: its deadline, pause, resume and connect.

// setTimeout sets the deadline to now + timeout seconds (0: none, where
// the server allows it), shortening or extending it.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if req.Timeout == nil {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout (seconds, >= 0) is required"))
		return
	}
	d, err := seconds(req.Timeout)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if _, err := s.m.SetTimeout(r.Context(), r.PathValue("id"), *d); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend moves the deadline of id to now + d when that is later; it never
// shortens a deadline and leaves a sandbox without one alone.
func (s *Server) extend(ctx context.Context, id string, d time.Duration) error {
	sb, err := s.m.Get(ctx, id)
	if err != nil {
		return err
	}
	if sb.Deadline.IsZero() || !time.Now().Add(d).After(sb.Deadline) {
		return nil
	}
	_, err = s.m.SetTimeout(ctx, id, d)
	return err
}

// refresh extends the deadline by "duration" seconds from now (never
// shortening it).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duration int64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if req.Duration < 0 || req.Duration > 3600 {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "duration must be 0 to 3600 seconds"))
		return
	}
	if err := s.extend(r.Context(), r.PathValue("id"), time.Duration(req.Duration)*time.Second); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, ok := any(s.m).(pauser)
	if !ok {
		if _, err := s.m.Get(r.Context(), id); err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented,
			"pausing sandboxes is not supported by this Corral daemon yet: sandbox %s keeps running; extend its life with setTimeout", id))
		return
	}
	if _, err := p.Pause(r.Context(), id); err != nil {
		s.writeAPIError(w, r, err) // already paused: failed_precondition, 409, which the SDK reads as "was paused"
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeIfPaused resumes a paused sandbox and reports whether it did.
func (s *Server) resumeIfPaused(ctx context.Context, sb sandbox.Sandbox) (sandbox.Sandbox, bool, error) {
	if sb.State != sandbox.StatePaused {
		return sb, false, nil
	}
	p, ok := any(s.m).(pauser)
	if !ok {
		return sb, false, errdefs.Errorf(errdefs.ErrNotImplemented, "sandbox %s is paused and this Corral daemon cannot resume it through the E2B API", sb.ID)
	}
	sb, err := p.Resume(ctx, sb.ID)
	return sb, err == nil, err
}

// resumeRequest reads the body of connect and resume, {"timeout":
// seconds} with the timeout optional, and the sandbox they name.
func (s *Server) resumeRequest(r *http.Request) (sandbox.Sandbox, *time.Duration, error) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return sandbox.Sandbox{}, nil, err
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		return sandbox.Sandbox{}, nil, err
	}
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	return sb, timeout, err
}

// connect resumes a paused sandbox and extends (never shortens) its
// deadline to now + timeout when a timeout is given. 201 means resumed,
// 200 already running.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	sb, timeout, err := s.resumeRequest(r)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	sb, resumed, err := s.resumeIfPaused(r.Context(), sb)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if sb.State != sandbox.StateRunning {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s and cannot be connected to", sb.ID, sb.State))
		return
	}
	if timeout != nil {
		if err := s.extend(r.Context(), sb.ID, *timeout); err != nil {
			s.writeAPIError(w, r, err)
			return
		}
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.info(sb, true, false))
}

// resume is the deprecated resume call: 409 when the sandbox runs.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	sb, timeout, err := s.resumeRequest(r)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if sb.State != sandbox.StatePaused {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not paused", sb.ID, sb.State))
		return
	}
	if sb, _, err = s.resumeIfPaused(r.Context(), sb); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if timeout != nil {
		if sb, err = s.m.SetTimeout(r.Context(), sb.ID, *timeout); err != nil {
			s.writeAPIError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, s.info(sb, true, false))
}
