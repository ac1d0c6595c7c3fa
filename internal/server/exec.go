package server

import (
	"encoding/json"
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// exec streams a process's events as NDJSON. Errors before the process
// starts are ordinary error responses; later failures become an "error"
// event, since the status line is already sent.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkExec(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st := newExecStream(w, s.redactor(r))
	if err := s.m.Exec(r.Context(), r.PathValue("id"), req, st.exec); err != nil {
		st.fail(r, err)
	}
}

// checkExec checks what the server requires of an exec request.
func checkExec(req wire.ExecRequest) error {
	if (len(req.Cmd) == 0) == (req.Shell == "") {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "exactly one of cmd and shell must be set")
	}
	var f fields
	f.req(sandbox.RangeExecTimeout, req.TimeoutMS)
	f.req(sandbox.RangeExecOutput, req.MaxOutputBytes)
	return f.err
}

// execStream writes the events of an exec as newline-delimited JSON:
// status 200 and the headers with the first event (lazyHeader), and each
// event flushed but an exit, which ends the exec and which the end of the
// response carries in the same write.
type execStream struct {
	lazy   *lazyHeader
	rc     *http.ResponseController
	enc    *json.Encoder
	redact func(error) error // what the client may see of an error
}

func newExecStream(w http.ResponseWriter, redact func(error) error) *execStream {
	lazy := &lazyHeader{w: w}
	return &execStream{lazy: lazy, rc: http.NewResponseController(w), enc: json.NewEncoder(lazy), redact: redact}
}

// write writes the event v, then flushes when flush is set.
func (st *execStream) write(v any, flush bool) error {
	if err := st.enc.Encode(v); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	return st.rc.Flush()
}

// exec writes one exec event.
func (st *execStream) exec(ev wire.ExecEvent) error {
	return st.write(ev, ev.Type != wire.EventExit)
}

// fail reports err: as the response when nothing was written yet, else as
// a last error event, unless the client of r is gone.
func (st *execStream) fail(r *http.Request, err error) {
	if !st.lazy.started {
		wire.WriteError(st.lazy.w, st.redact(err))
		return
	}
	if r.Context().Err() == nil {
		_ = st.write(wire.ExecEvent{Type: wire.EventError, Error: errorOf(st.redact(err))}, true)
	}
}
