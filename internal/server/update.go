package server

import (
	"math"
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// UpdateRequest is the body of PATCH /v1/sandboxes/{id}: new limits for a
// running or paused sandbox. Omitted fields keep their value; the disk
// limit cannot change.
type UpdateRequest struct {
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	Pids     int64   `json:"pids,omitempty"`
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) {
	var req UpdateRequest
	if err := decode(r, &req); err != nil {
		wire.WriteError(w, err)
		return
	}
	if req.CPUs < 0 || req.MemoryMB < 0 || req.Pids < 0 {
		wire.WriteError(w, errdefs.Errorf(errdefs.ErrInvalidArgument, "cpus, memory_mb and pids must not be negative"))
		return
	}
	if req.CPUs == 0 && req.MemoryMB == 0 && req.Pids == 0 {
		wire.WriteError(w, errdefs.Errorf(errdefs.ErrInvalidArgument, "nothing to change: set cpus, memory_mb or pids"))
		return
	}
	sb, err := s.m.UpdateResources(r.Context(), r.PathValue("id"), sandbox.Limits{
		MilliCPUs:   int64(math.Round(req.CPUs * 1000)),
		MemoryBytes: req.MemoryMB << 20,
		Pids:        req.Pids,
	})
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}
