package server

import (
	"math"
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// UpdateRequest is the body of PATCH /v1/sandboxes/{id}: new limits for a
// running or paused sandbox, and new lifecycle timers. Omitted fields keep
// their value; the disk limit cannot change; idle_timeout 0 turns the idle
// timeout off. The deadline changes only through /timeout.
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
		wire.WriteError(w, err)
		return
	}
	if req.CPUs < 0 || req.MemoryMB < 0 || req.Pids < 0 || (req.IdleTimeout != nil && *req.IdleTimeout < 0) {
		wire.WriteError(w, errdefs.Errorf(errdefs.ErrInvalidArgument, "cpus, memory_mb, pids and idle_timeout must not be negative"))
		return
	}
	limits := req.CPUs != 0 || req.MemoryMB != 0 || req.Pids != 0
	timers := req.IdleTimeout != nil || req.OnDeadline != "" || req.OnIdle != ""
	if !limits && !timers {
		wire.WriteError(w, errdefs.Errorf(errdefs.ErrInvalidArgument, "nothing to change: set cpus, memory_mb, pids, idle_timeout, on_deadline or on_idle"))
		return
	}
	// Limits first: they are the change a runtime may refuse.
	id := r.PathValue("id")
	var sb sandbox.Sandbox
	var err error
	if limits {
		sb, err = s.m.UpdateResources(r.Context(), id, sandbox.Limits{
			MilliCPUs:   int64(math.Round(req.CPUs * 1000)),
			MemoryBytes: req.MemoryMB << 20,
			Pids:        req.Pids,
		})
	}
	if err == nil && timers {
		l := sandbox.Lifecycle{OnDeadline: sandbox.Action(req.OnDeadline), OnIdle: sandbox.Action(req.OnIdle)}
		if req.IdleTimeout != nil {
			d := time.Duration(*req.IdleTimeout) * time.Second
			l.IdleTimeout = &d
		}
		sb, err = s.m.SetLifecycle(r.Context(), id, l)
	}
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}
