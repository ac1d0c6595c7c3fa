package server

import "net/http"

// ReadySnapshotRequest is the optional body of
// POST /v1/templates/{name}/ready-snapshot: the runtime to capture on
// (omitted: the server's default runtime).
type ReadySnapshotRequest struct {
	Runtime string `json:"runtime,omitempty"`
}

func (s *Server) readyRoutes() []route {
	return []route{
		{"POST /v1/templates/{name}/ready-snapshot", s.captureReady},
		{"DELETE /v1/templates/{name}/ready-snapshot", s.dropReady},
	}
}

// captureReady makes (or replaces) the template's ready snapshot on a
// runtime and answers with the template, which names it.
func (s *Server) captureReady(w http.ResponseWriter, r *http.Request) {
	var req ReadySnapshotRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	t, err := s.m.CaptureReady(r.Context(), r.PathValue("name"), req.Runtime)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// dropReady removes the template's ready snapshot on the runtime named by
// the query parameter runtime (omitted: the default runtime).
func (s *Server) dropReady(w http.ResponseWriter, r *http.Request) {
	t, err := s.m.DropReady(r.Context(), r.PathValue("name"), r.URL.Query().Get("runtime"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}
