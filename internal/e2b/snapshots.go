package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// This file maps E2B's snapshots and forks onto the Manager's. An E2B
// snapshot ID is a Corral snapshot name; like E2B, a create whose
// templateID names a snapshot starts from it (see create), and deleting
// "template" ID removes the snapshot. The sandboxes made from a snapshot
// and a fork's copies mount the same volumes as their source: an E2B
// volume outlives the sandboxes that mount it, and E2B has no copies.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOfSnapshot(sn sandbox.Snapshot) snapshotInfo {
	return snapshotInfo{SnapshotID: sn.Name, Names: []string{sn.Name}}
}

// createSnapshot is POST /sandboxes/{id}/snapshots with an optional name.
// On gVisor the snapshot holds memory and running processes, on runc the
// files (GET /v1/runtimes on Corral's API says which).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if req.Name == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		req.Name = "snap-" + hex.EncodeToString(b)
	}
	sn, err := s.m.Snapshot(r.Context(), r.PathValue("id"), sandbox.SnapshotSpec{Name: req.Name, Volumes: sandbox.VolumesShare})
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, infoOfSnapshot(sn))
}

// listSnapshots is GET /snapshots, optionally of one sandbox (sandboxID)
// or one name. All fit in one page: no nextToken is returned.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	out := []snapshotInfo{}
	for _, sn := range s.m.Snapshots(r.Context()) {
		if id := q.Get("sandboxID"); id != "" && sn.SandboxID != id {
			continue
		}
		if name := q.Get("name"); name != "" && sn.Name != name {
			continue
		}
		out = append(out, infoOfSnapshot(sn))
	}
	if l, err := strconv.Atoi(q.Get("limit")); err == nil && l > 0 && l < len(out) {
		out = out[:l]
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}: a snapshot (the SDK's
// deleteSnapshot), the builds of a template that E2B's template-build
// API made (all its tags), or a Corral template by name. A template that
// a sandbox or snapshot uses stays, and the answer says so. A team deletes
// its own snapshots and templates; the builds of the template-build API
// are the operator's, which only admin keys delete.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	if _, err := s.m.GetSnapshot(r.Context(), name); err != nil {
		if p, ok := tenancy.From(r.Context()); ok && !p.Admin && s.tags != nil {
			if _, tagged := s.tags.resolve(name); tagged {
				s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrPermissionDenied, "template %s was built through the template-build API, whose templates every team shares: only admin keys delete it", name))
				return
			}
		}
		ok, derr := s.deleteTemplateBuilds(r.Context(), name)
		if !ok {
			if _, terr := s.m.Template(r.Context(), name); terr != nil {
				s.writeAPIError(w, r, err)
				return
			}
			derr = s.m.DeleteTemplate(r.Context(), name)
		}
		if derr != nil {
			s.writeAPIError(w, r, derr)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := s.m.DeleteSnapshot(r.Context(), name); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is one element of the fork answer: a sandbox or an error.
type forkResult struct {
	Sandbox *sandboxInfo `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork with count copies (default 1) and an
// optional timeout. Corral makes all copies or none, so the answer holds
// only sandboxes; on gVisor each continues the source's processes, on runc
// each starts fresh ones on a copy of its files.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	copies, err := s.m.ForkWith(r.Context(), r.PathValue("id"), n, sandbox.ForkOptions{Volumes: sandbox.VolumesShare})
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := make([]forkResult, len(copies))
	for i, sb := range copies {
		if timeout != nil {
			if sb, err = s.m.SetTimeout(r.Context(), sb.ID, *timeout); err != nil {
				e := apiErrorOf(s.redact(r, err))
				out[i] = forkResult{Error: &e}
				continue
			}
		}
		info := s.info(sb, true, false)
		out[i] = forkResult{Sandbox: &info}
	}
	writeJSON(w, http.StatusCreated, out)
}
