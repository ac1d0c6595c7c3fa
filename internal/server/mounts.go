package server

import (
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// Mount is a host directory or a volume a sandbox sees, in requests and
// in the sandbox's view. The Manager checks it (sandbox.Mount): the
// server only translates, since every rule about sources belongs to the
// daemon's policy.
type Mount struct {
	// Source is an absolute host path beneath a directory the daemon
	// allows (corral server --allow-mount); Volume names a volume
	// instead. A mount has exactly one of the two.
	Source string `json:"source,omitempty"`
	Volume string `json:"volume,omitempty"`
	// Target is the absolute path in the sandbox.
	Target string `json:"target"`
	// Mode is "ro", "rw" or "cow"; empty in a request means "rw", and a
	// view always names it.
	Mode string `json:"mode,omitempty"`
}

// specMounts returns the Manager's form of a request's mounts.
func specMounts(ms []Mount) []sandbox.Mount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]sandbox.Mount, len(ms))
	for i, m := range ms {
		out[i] = sandbox.Mount{Source: m.Source, Volume: m.Volume, Target: m.Target, Mode: sandbox.MountMode(m.Mode)}
	}
	return out
}

// mountViews returns the API's form of a sandbox's mounts.
func mountViews(ms []sandbox.Mount) []Mount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]Mount, len(ms))
	for i, m := range ms {
		out[i] = Mount{Source: m.Source, Volume: m.Volume, Target: m.Target, Mode: string(m.Mode)}
	}
	return out
}

// Change is a path a sandbox changed under a copy-on-write mount: its
// path in the sandbox and "added", "modified" or "deleted".
type Change struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
}

// MountChanges answers GET /v1/sandboxes/{id}/mounts/changes?target=T.
type MountChanges struct {
	Changes []Change `json:"changes"`
}

// mountChanges lists what a sandbox changed under its cow mount at the
// query's target, compared with the host directory.
func (s *Server) mountChanges(w http.ResponseWriter, r *http.Request) {
	target := r.URL.Query().Get("target")
	if target == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "target is required: the mount's path in the sandbox"))
		return
	}
	cs, err := s.m.MountChanges(r.Context(), r.PathValue("id"), target)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := MountChanges{Changes: make([]Change, len(cs))}
	for i, c := range cs {
		out.Changes[i] = Change{Path: c.Path, Kind: string(c.Kind)}
	}
	writeJSON(w, http.StatusOK, out)
}
