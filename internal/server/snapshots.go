package server

import (
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// SnapshotView is a snapshot as the API shows it; like SandboxView it
// leaves out environment values.
type SnapshotView struct {
	Name      string            `json:"name"`
	Kind      string            `json:"kind"`
	SandboxID string            `json:"sandbox_id"`
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	CPUs      float64           `json:"cpus"`
	MemoryMB  int64             `json:"memory_mb"`
	Pids      int64             `json:"pids"`
	DiskMB    int64             `json:"disk_mb,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Tenant    string            `json:"tenant,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	SizeBytes int64             `json:"size_bytes"`
	// Mounts are the volumes sandboxes made from the snapshot mount; with
	// VolumesCopied the snapshot's copies, of which each gets a copy.
	Mounts        []Mount `json:"mounts,omitempty"`
	VolumesCopied bool    `json:"volumes_copied,omitempty"`
}

func snapshotView(s sandbox.Snapshot) SnapshotView {
	return SnapshotView{
		Name: s.Name, Kind: s.Kind, SandboxID: s.SandboxID, Template: s.Template, Runtime: s.Runtime,
		CPUs: float64(s.MilliCPUs) / 1000, MemoryMB: s.MemoryBytes >> 20, Pids: s.Pids, DiskMB: s.DiskBytes >> 20,
		Metadata: s.Metadata, Tenant: s.Tenant, CreatedAt: s.CreatedAt, SizeBytes: s.SizeBytes,
		Mounts: mountViews(s.Mounts), VolumesCopied: s.VolumesCopied,
	}
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name     string            `json:"name"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Volumes is "share" or "copy" (sandbox.SnapshotSpec).
	Volumes string `json:"volumes,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"`
	// Volumes is "share" or "copy": what the copies get of the source's
	// volumes (sandbox.ForkOptions).
	Volumes string `json:"volumes,omitempty"`
}

// ResumeRequest is the optional body of POST /v1/sandboxes/{id}/resume:
// the new deadline is now + Timeout seconds (omitted: the server default;
// 0: no deadline, if allowed).
type ResumeRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

// FromSnapshotRequest is the body of
// POST /v1/templates/{name}/from-snapshot.
type FromSnapshotRequest struct {
	Snapshot string `json:"snapshot"`
}

func (s *Server) snapshotRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/pause", s.pauseSandbox},
		{"POST /v1/sandboxes/{id}/resume", s.resumeSandbox},
		{"POST /v1/sandboxes/{id}/snapshots", s.createSnapshot},
		{"POST /v1/sandboxes/{id}/fork", s.forkSandbox},
		{"GET /v1/snapshots", s.listSnapshots},
		{"GET /v1/snapshots/{name}", s.getSnapshot},
		{"DELETE /v1/snapshots/{name}", s.deleteSnapshot},
		{"POST /v1/templates/{name}/from-snapshot", s.templateFromSnapshot},
	}
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Pause(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	var req ResumeRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	var sb sandbox.Sandbox
	var err error
	var f fields
	timeout := f.seconds(sandbox.RangeTimeout, req.Timeout)
	switch {
	case f.err != nil:
		err = f.err
	case timeout == nil:
		sb, err = s.m.Resume(r.Context(), r.PathValue("id"))
	default:
		sb, err = s.m.ResumeFor(r.Context(), r.PathValue("id"), *timeout)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req SnapshotRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	snap, err := s.m.Snapshot(r.Context(), r.PathValue("id"), sandbox.SnapshotSpec{Name: req.Name, Metadata: req.Metadata, Volumes: req.Volumes})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotView(snap))
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req ForkRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var f fields
	n := f.req(sandbox.RangeForkCount, int64(req.Count))
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	copies, err := s.m.ForkWith(r.Context(), r.PathValue("id"), int(n), sandbox.ForkOptions{Volumes: req.Volumes})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, views(copies, viewOf))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, views(s.m.Snapshots(r.Context()), snapshotView))
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.m.GetSnapshot(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotView(snap))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSnapshot(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) templateFromSnapshot(w http.ResponseWriter, r *http.Request) {
	var req FromSnapshotRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Snapshot == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot is required"))
		return
	}
	t, err := s.m.TemplateFromSnapshot(r.Context(), r.PathValue("name"), req.Snapshot)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}
