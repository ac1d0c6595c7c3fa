package server

import (
	"net/http"
	"regexp"
	"strconv"

	"github.com/corralrun/corral/internal/interpreter"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// CodeInterpreterService is the service of a code-interpreter template:
// the interpreter (`/.corral/agent interpreter`, the agent binary every
// sandbox has) with kernels running as "user", restarted if it fails, and
// ready once its default Python and JavaScript contexts answer, so that a
// sandbox's first execution pays no kernel start.
func CodeInterpreterService() *sandbox.Service {
	return &sandbox.Service{
		Cmd:            []string{"/.corral/agent", "interpreter", "--user", "user"},
		Restart:        wire.RestartOnFailure,
		Ready:          &wire.ReadyCheck{URL: "http://127.0.0.1:" + strconv.Itoa(interpreter.Port) + "/health", IntervalMS: 20},
		ReadyTimeoutMS: 120_000,
	}
}

func (s *Server) codeRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/code", s.runCode},
		{"GET /v1/sandboxes/{id}/code/contexts", s.listCodeContexts},
		{"POST /v1/sandboxes/{id}/code/contexts", s.createCodeContext},
		{"DELETE /v1/sandboxes/{id}/code/contexts/{context}", s.deleteCodeContext},
		{"POST /v1/sandboxes/{id}/code/contexts/{context}/restart", s.restartCodeContext},
	}
}

// kernelEnvName is what the interpreter accepts as a variable name.
var kernelEnvName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// runCode streams one execution as NDJSON CodeEvents. The sandbox's
// environment is the base of the execution's (so that a sandbox claimed
// from a pool, whose interpreter started before the claim, still sees the
// claimer's variables); req.Env overrides it. Errors before the first
// event are ordinary error responses: an unknown context is not_found, a
// sandbox without an interpreter failed_precondition.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	var req CodeRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	ereq := interpreter.ExecuteRequest{Code: req.Code, ContextID: req.ContextID, Language: req.Language,
		Env: req.Env, TimeoutMS: req.TimeoutMS, MaxOutputBytes: req.MaxOutputBytes}
	var f fields
	f.req(sandbox.RangeExecTimeout, req.TimeoutMS)
	f.req(sandbox.RangeCodeOutput, req.MaxOutputBytes)
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	if err := interpreter.CheckExecute(ereq, sandbox.RangeCodeOutput.Max); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	sb, err := s.m.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(sb.Env) > 0 {
		env := map[string]string{}
		for k, v := range sb.Env {
			if kernelEnvName.MatchString(k) {
				env[k] = v
			}
		}
		for k, v := range req.Env {
			env[k] = v
		}
		ereq.Env = env
	}
	defer s.m.Active(id)()
	done, err := s.auditCode(r, id, req.Code, req.Language)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st := newExecStream(w, s.redactor(r))
	var count int
	err = s.code.Execute(r.Context(), id, ereq, func(e interpreter.Event) error {
		switch e.Type {
		case interpreter.EventStdout, interpreter.EventStderr:
			return st.write(CodeEvent{Type: e.Type, Text: e.Text}, true)
		case interpreter.EventResult:
			return st.write(CodeEvent{Type: CodeEventResult, Result: e.Result, Main: e.Main}, true)
		case interpreter.EventError:
			return st.write(CodeEvent{Type: CodeEventException, Exception: &CodeException{Name: e.Name, Value: e.Value, Traceback: e.Traceback}}, true)
		case interpreter.EventCount:
			count = e.Count
		case interpreter.EventEnd:
			return st.write(CodeEvent{Type: CodeEventEnd, ExecutionCount: count, TimedOut: e.TimedOut,
				OutputTruncated: e.Truncated > 0, OutputDiscarded: e.Truncated}, false)
		}
		return nil
	})
	done(err)
	if err != nil {
		st.fail(r, err)
	}
}

func (s *Server) listCodeContexts(w http.ResponseWriter, r *http.Request) {
	if !s.visible(w, r) {
		return
	}
	out, err := s.code.Contexts(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) {
	if !s.visible(w, r) {
		return
	}
	var req CodeContextRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := interpreter.Language(req.Language); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	defer s.m.Active(id)()
	c, err := s.code.CreateContext(r.Context(), id, interpreter.ContextRequest{Language: req.Language, Cwd: req.Cwd})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

func (s *Server) deleteCodeContext(w http.ResponseWriter, r *http.Request) {
	if !s.visible(w, r) {
		return
	}
	if err := s.code.DeleteContext(r.Context(), r.PathValue("id"), r.PathValue("context")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartCodeContext(w http.ResponseWriter, r *http.Request) {
	if !s.visible(w, r) {
		return
	}
	id := r.PathValue("id")
	defer s.m.Active(id)()
	c, err := s.code.RestartContext(r.Context(), id, r.PathValue("context"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// visible answers not_found, and reports false, unless the caller sees
// the sandbox the request names. The interpreter's connections are pooled
// per sandbox, so a request that reuses one is not checked by a dial:
// every code route checks first.
func (s *Server) visible(w http.ResponseWriter, r *http.Request) bool {
	if _, err := s.m.Get(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return false
	}
	return true
}
