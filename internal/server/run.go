package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// RunRequest is the body of POST /v1/run: a sandbox to create, a command
// to run in it, and whether to delete the sandbox once the command ends.
type RunRequest struct {
	Sandbox CreateRequest    `json:"sandbox"`
	Exec    wire.ExecRequest `json:"exec"`
	// Remove deletes the sandbox after the command, also when the command
	// could not start or the client went away.
	Remove bool `json:"remove,omitempty"`
}

// RunEvent is the first event of a run: the sandbox made for it. The
// exec's events follow.
type RunEvent struct {
	Type    string       `json:"type"` // "sandbox"
	Sandbox *SandboxView `json:"sandbox"`
}

// run creates a sandbox and runs one command in it (sandbox.Manager.Run)
// in one round trip. A create that fails is the response's error; from the
// sandbox event on, the answer is a 200 stream whose failures are error
// events, as for exec. With remove, the failure to delete the sandbox is
// an error event after the exit.
func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	var req RunRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	spec, err := req.Sandbox.spec()
	if err == nil {
		err = checkExec(req.Exec)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st := newExecStream(w, s.redactor(r))
	created := func(sb sandbox.Sandbox) error {
		// Sent with the exec's first event, which follows at once.
		v := viewOf(sb)
		return st.write(RunEvent{Type: "sandbox", Sandbox: &v}, false)
	}
	sb, err := s.m.Run(r.Context(), spec, req.Exec, created, st.exec)
	if err != nil {
		st.fail(r, err)
	}
	if req.Remove && sb.ID != "" {
		// The exit goes out first: deleting takes milliseconds.
		_ = st.rc.Flush()
		// Gone already is fine: deleted meanwhile, or reaped at its deadline.
		if err := s.m.Delete(context.WithoutCancel(r.Context()), sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			st.fail(r, err)
		}
	}
}
