package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// procOp is the part of a process handler that runs once the sandbox's
// agent and the process ID are known. It returns the status and JSON body
// of the answer (a nil body with 204), or status 0 when it wrote the
// response itself.
type procOp func(ag *agentclient.Client, pid int) (int, any, error)

// proc resolves the running sandbox's agent and the {pid} path value, then
// runs op and writes its answer or its error.
func (s *Server) proc(op procOp) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		pid, err := pidValue(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		ag, err := s.m.Agent(r.Context(), r.PathValue("id"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		status, out, err := op(ag, pid)
		switch {
		case err != nil:
			s.writeError(w, r, err)
		case status == http.StatusNoContent:
			w.WriteHeader(status)
		case status != 0:
			writeJSON(w, status, out)
		}
	}
}

// pidValue parses the {pid} path value: a positive decimal number.
func pidValue(r *http.Request) (int, error) {
	v := r.PathValue("pid")
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid process ID %q: want a positive number", v)
	}
	return pid, nil
}

// queryOffset parses the optional from query parameter: a byte offset into
// a process's output, default 0.
func queryOffset(r *http.Request) (int64, error) {
	v := r.URL.Query().Get("from")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid from %q: want a byte offset >= 0", v)
	}
	return n, nil
}

// checkPTYSize checks a terminal size against its ranges.
func checkPTYSize(p wire.PTYSize) error {
	var f fields
	f.req(sandbox.RangePTYCols, int64(p.Cols))
	f.req(sandbox.RangePTYRows, int64(p.Rows))
	return f.err
}

// queryBool parses an optional boolean query parameter (default false).
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid %s %q: want true or false", name, v)
	}
	return b, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req wire.StartRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	err := checkExec(req.ExecRequest)
	if err == nil && req.PTY != nil {
		err = checkPTYSize(*req.PTY)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.m.StartProcess(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	ag, err := s.m.Agent(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := ag.Processes(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []wire.ProcessInfo{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		info, err := ag.Process(r.Context(), pid)
		return http.StatusOK, info, err
	})(w, r)
}

func (s *Server) removeProcess(w http.ResponseWriter, r *http.Request) {
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		return http.StatusNoContent, nil, ag.RemoveProcess(r.Context(), pid)
	})(w, r)
}

func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request) {
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		info, err := ag.Wait(r.Context(), pid)
		return http.StatusOK, info, err
	})(w, r)
}

// writeStdin streams the request body to the process's stdin as it
// arrives; the body may stay open as long as the client likes.
func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request) {
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		return http.StatusNoContent, nil, ag.WriteStdin(r.Context(), pid, r.Body)
	})(w, r)
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request) {
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		return http.StatusNoContent, nil, ag.CloseStdin(r.Context(), pid)
	})(w, r)
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	var req wire.SignalRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Signal == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "signal is required"))
		return
	}
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		return http.StatusNoContent, nil, ag.Signal(r.Context(), pid, req.Signal)
	})(w, r)
}

func (s *Server) resizeProcess(w http.ResponseWriter, r *http.Request) {
	var req wire.PTYSize
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkPTYSize(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		return http.StatusNoContent, nil, ag.Resize(r.Context(), pid, req)
	})(w, r)
}

// processOutput streams a process's output as NDJSON ExecEvents, flushed
// one by one. As with exec, an error before the first event is an error
// response and a later one an "error" event.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	from, err := queryOffset(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := queryBool(r, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		st := newStream(w, s.redactor(r))
		err := ag.ProcessOutput(r.Context(), pid, from, follow, func(ev wire.ExecEvent) error { return st.send(ev) })
		if err != nil && !st.started {
			return 0, nil, err
		}
		st.finish(r, err)
		return 0, nil, nil
	})(w, r)
}

func (s *Server) readArchive(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		body, err := ag.ReadArchive(r.Context(), p)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
		// A failure midway cuts the response short; the client's tar reader
		// then sees an unexpected end instead of a clean one.
		if _, err := io.Copy(w, body); err != nil {
			panic(http.ErrAbortHandler)
		}
		return nil, nil
	})(w, r)
}

func (s *Server) writeArchive(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		if err := ag.WriteArchive(r.Context(), p, r.Body); err != nil {
			return nil, err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil, nil
	})(w, r)
}

// watch streams changes under a directory as NDJSON WatchEvents until the
// client goes away.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.files(true, func(ag *agentclient.Client, p string) (any, error) {
		// The agent's client does not say when the watch is in place, only
		// when events come; a quiet directory would hold back the status
		// line. Checking the path first keeps "no such directory" an error
		// status, and the stream starts at once.
		if _, err := ag.Stat(r.Context(), p); err != nil {
			return nil, err
		}
		st := newStream(w, s.redactor(r))
		st.start()
		_ = st.rc.Flush()
		err := ag.Watch(r.Context(), p, recursive, func(ev wire.WatchEvent) error { return st.send(ev) })
		st.finish(r, err)
		return nil, nil
	})(w, r)
}

// stream writes NDJSON events, sending the 200 header with the first one
// and flushing each, so that errors before any event can still be proper
// error responses.
type stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	redact  func(error) error // what the client may see of an error
	started bool
}

func newStream(w http.ResponseWriter, redact func(error) error) *stream {
	return &stream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w), redact: redact}
}

func (st *stream) start() {
	if st.started {
		return
	}
	st.w.Header().Set("Content-Type", "application/x-ndjson")
	st.w.Header().Set("X-Content-Type-Options", "nosniff")
	st.w.WriteHeader(http.StatusOK)
	st.started = true
}

func (st *stream) send(ev any) error {
	st.start()
	if err := st.enc.Encode(ev); err != nil {
		return err
	}
	return st.rc.Flush()
}

// finish ends a stream that has begun (or begins an empty one). err, the
// reason the stream stopped, becomes an error event unless it is the
// client going away.
func (st *stream) finish(r *http.Request, err error) {
	st.start()
	if err != nil && r.Context().Err() == nil {
		_ = st.enc.Encode(wire.ExecEvent{Type: wire.EventError, Error: errorOf(st.redact(err))})
	}
	_ = st.rc.Flush()
}
