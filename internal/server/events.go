package server

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/tenancy"
)

// events streams lifecycle events as NDJSON until the client goes away.
// Query: sandbox_id (one sandbox) and type (repeatable or comma-separated).
// The status line is sent once the subscription exists, so a client that
// has it sees every later change. A client that falls too far behind gets
// an error event without sandbox_id, and the stream ends.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := events.Filter{SandboxID: q.Get("sandbox_id")}
	for _, v := range q["type"] {
		for t := range strings.SplitSeq(v, ",") {
			if !slices.Contains(events.Types, t) {
				s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown event type %q (available: %s)", t, strings.Join(events.Types, ", ")))
				return
			}
			f.Types = append(f.Types, t)
		}
	}
	sub := s.m.Events().Subscribe(f)
	defer sub.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-sub.C():
			if !ok {
				return
			}
			if ev.SandboxID != "" && !tenancy.Sees(r.Context(), ev.Tenant) {
				continue
			}
			if enc.Encode(ev) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}
