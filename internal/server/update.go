package server

import (
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// UpdateRequest is the body of PATCH /v1/sandboxes/{id}: new limits for a
// running or paused sandbox, and new lifecycle timers, applied all or
// nothing (sandbox.Manager.Update). Omitted fields keep their value; the
// disk limit cannot change; idle_timeout 0 turns the idle timeout off. The
// deadline changes only through /timeout.
type UpdateRequest struct {
	CPUs        float64 `json:"cpus,omitempty"`
	MemoryMB    int64   `json:"memory_mb,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	IdleTimeout *int64  `json:"idle_timeout,omitempty"`
	OnDeadline  string  `json:"on_deadline,omitempty"`
	OnIdle      string  `json:"on_idle,omitempty"`
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) {
	var req UpdateRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var f fields
	u := sandbox.Update{
		Limits: sandbox.Limits{
			MilliCPUs:   f.cpus(req.CPUs),
			MemoryBytes: f.opt(sandbox.RangeMemory, req.MemoryMB),
			Pids:        f.opt(sandbox.RangePids, req.Pids),
		},
		Lifecycle: sandbox.Lifecycle{
			IdleTimeout: f.seconds(sandbox.RangeIdleTimeout, req.IdleTimeout),
			OnDeadline:  sandbox.Action(req.OnDeadline),
			OnIdle:      sandbox.Action(req.OnIdle),
		},
	}
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	if u == (sandbox.Update{}) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "nothing to change: set cpus, memory_mb, pids, idle_timeout, on_deadline or on_idle"))
		return
	}
	sb, err := s.m.Update(r.Context(), r.PathValue("id"), u)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}
