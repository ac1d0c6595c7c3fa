package server

import (
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/sandbox"
)

// PoolRequest is the body of PUT /v1/pools/{name}: the shape of the pool's
// sandboxes and how many it keeps ready. Omitted resources take the
// server's defaults, an omitted runtime and network mode the server's
// default ones.
type PoolRequest struct {
	Template string  `json:"template"`
	Runtime  string  `json:"runtime,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	Pids     int64   `json:"pids,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	Network  string  `json:"network,omitempty"`
	Size     int     `json:"size"`
}

// PoolView is a warm pool as the API shows it.
type PoolView struct {
	Name     string     `json:"name"`
	Template string     `json:"template"`
	Runtime  string     `json:"runtime"`
	CPUs     float64    `json:"cpus"`
	MemoryMB int64      `json:"memory_mb"`
	Pids     int64      `json:"pids"`
	DiskMB   int64      `json:"disk_mb,omitempty"`
	Network  string     `json:"network"`
	Size     int        `json:"size"`
	Ready    int        `json:"ready"`
	Filling  int        `json:"filling"`
	Error    string     `json:"error,omitempty"`
	RetryAt  *time.Time `json:"retry_at,omitempty"`
}

func poolView(st sandbox.PoolStatus) PoolView {
	v := PoolView{
		Name: st.Name, Template: st.Template, Runtime: st.Runtime, CPUs: float64(st.MilliCPUs) / 1000,
		MemoryMB: st.MemoryBytes >> 20, Pids: st.Pids, DiskMB: st.DiskBytes >> 20, Network: string(st.Network),
		Size: st.Size, Ready: st.Ready, Filling: st.Filling, Error: st.Error,
	}
	if !st.RetryAt.IsZero() {
		t := st.RetryAt
		v.RetryAt = &t
	}
	return v
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, views(s.m.Pools(), poolView))
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.PoolStatus(r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolView(st))
}

func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	var req PoolRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var f fields
	def := sandbox.Pool{
		Name:        r.PathValue("name"),
		Template:    req.Template,
		Runtime:     req.Runtime,
		MilliCPUs:   f.cpus(req.CPUs),
		MemoryBytes: f.opt(sandbox.RangeMemory, req.MemoryMB),
		Pids:        f.opt(sandbox.RangePids, req.Pids),
		DiskBytes:   f.opt(sandbox.RangeDisk, req.DiskMB),
		Network:     egress.Mode(req.Network),
		Size:        int(f.req(sandbox.RangePoolSize, int64(req.Size))),
	}
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	st, err := s.m.SetPool(r.Context(), def)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolView(st))
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RemovePool(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
