package agentserver

import (
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// handleStart serves POST /processes: it starts a background process and
// answers at once with its description.
func (s *Server) handleStart(w http.ResponseWriter, r *http.Request) {
	var req wire.StartRequest
	if err := decodeJSON(w, r, &req, maxExecRequest); err != nil {
		wire.WriteError(w, err)
		return
	}
	spec, err := s.prepareStart(&req)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	p, err := s.procs.start(spec, nil)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, p.info())
}

// handleProcesses serves GET /processes.
func (s *Server) handleProcesses(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.procs.list())
}

// pidValue parses the {pid} path value.
func pidValue(r *http.Request) (int, error) {
	v := r.PathValue("pid")
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return 0, errorf(errdefs.ErrInvalidArgument, "invalid process ID %q: want a positive number", v)
	}
	return pid, nil
}

// process returns the process named by the {pid} path value.
func (s *Server) process(r *http.Request) (*process, error) {
	pid, err := pidValue(r)
	if err != nil {
		return nil, err
	}
	return s.procs.get(pid)
}

// handleProcess serves GET /processes/{pid}.
func (s *Server) handleProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.info())
}

// handleOutput serves GET /processes/{pid}/output?from=N&follow=B: a start
// event (with how much before N is no longer kept), the kept output from
// N, then with follow the live output, and the exit event once the
// process has ended and all its output was sent.
//
// The stream reads the process's output log at its own pace: a client
// that falls more than the log's size behind resumes at the oldest kept
// byte, and the first event after the gap carries the number of bytes
// skipped in Dropped (its Offset jumps by as much). Neither the process
// nor other followers ever wait for a slow one.
func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	q := r.URL.Query()
	from, follow := int64(0), false
	if v := q.Get("from"); v != "" {
		if from, err = strconv.ParseInt(v, 10, 64); err != nil || from < 0 {
			wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "invalid from %q: want a byte offset >= 0", v))
			return
		}
	}
	if v := q.Get("follow"); v != "" {
		if follow, err = strconv.ParseBool(v); err != nil {
			wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "invalid follow %q: want true or false", v))
			return
		}
	}
	if p.out == nil {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition,
			"reading output of process %d: it is a foreground exec, whose output goes to its exec stream", p.pid))
		return
	}
	if _, end := p.out.bounds(); from > end {
		wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "reading output of process %d: from %d is beyond the end of its output (%d)", p.pid, from, end))
		return
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := jsonEncoder(w)
	ctx := r.Context()
	pc, skipped, wake, closed := p.out.next(from)
	if enc.Encode(wire.ExecEvent{Type: wire.EventStart, PID: p.pid, Dropped: skipped}) != nil || rc.Flush() != nil {
		return
	}
	skipped = 0 // reported on the start event
	for {
		switch {
		case len(pc.data) > 0:
			typ := wire.EventStdout
			if pc.stream == streamStderr {
				typ = wire.EventStderr
			}
			ev := wire.OutputEvent(typ, pc.data)
			ev.Offset, ev.Dropped = pc.off, skipped
			if enc.Encode(ev) != nil {
				return
			}
		case closed:
			_ = enc.Encode(exitEvent(p.exit))
			return
		case !follow:
			return
		default:
			if rc.Flush() != nil {
				return
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
		pc, skipped, wake, closed = p.out.next(pc.off + int64(len(pc.data)))
	}
}

// handleStdin serves POST /processes/{pid}/stdin: the body is written to
// the process's stdin as it arrives, so it may be a long-lived stream.
// The answer comes when the body ends (204), or when the process exits or
// its stdin is closed first (409).
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if p.stdin == nil || (!p.background && p.term == nil) {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition,
			"writing to stdin of process %d: its stdin is not open (start it with open_stdin or a pty)", p.pid))
		return
	}
	// A body read that waits for a client who sends nothing must end when
	// the process does; the connection's read deadline interrupts it.
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-p.done:
			interruptBody(w, 0)
		case <-stop:
		}
	}()
	err = p.stdin.copyFrom(r.Context(), p.pid, r.Body, p.done)
	close(stop)
	<-stopped
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case p.exited():
		// Checked first: the read deadline that ended the body read also
		// cancels the request's context.
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "writing to stdin of process %d: process has exited", p.pid))
	case r.Context().Err() != nil:
		// The client went away; nobody is left to answer.
	default:
		wire.WriteError(w, err)
	}
}

// handleCloseStdin serves DELETE /processes/{pid}/stdin.
func (s *Server) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if p.stdin == nil || (!p.background && p.term == nil) {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "closing stdin of process %d: its stdin is not open", p.pid))
		return
	}
	if err := p.stdin.closeInput(p.pid); err != nil {
		wire.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleSignal serves POST /processes/{pid}/signal.
func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	var req wire.SignalRequest
	if err := decodeJSON(w, r, &req, 1<<10); err != nil {
		wire.WriteError(w, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	p.mu.Lock()
	reaped := p.reaped
	p.signalLocked(sig)
	p.mu.Unlock()
	if reaped {
		wire.WriteError(w, errorf(errdefs.ErrFailedPrecondition, "signaling process %d: process has exited", p.pid))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseSignal accepts "SIGTERM", "TERM" (either case) or a number such as
// "15".
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errorf(errdefs.ErrInvalidArgument, "invalid signal number %d: want 1 to 64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, errorf(errdefs.ErrInvalidArgument, "unknown signal %q: want a name like SIGTERM or TERM, or a number", s)
}

// handleResize serves POST /processes/{pid}/resize.
func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	var req wire.PTYSize
	if err := decodeJSON(w, r, &req, 1<<10); err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := p.resize(req); err != nil {
		wire.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleWait serves GET /processes/{pid}/wait: it answers once the process
// has ended and all its output is in.
func (s *Server) handleWait(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	select {
	case <-p.done:
		writeJSON(w, http.StatusOK, p.info())
	case <-r.Context().Done():
	}
}

// handleRemoveProcess serves DELETE /processes/{pid}.
func (s *Server) handleRemoveProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pidValue(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := s.procs.remove(pid); err != nil {
		wire.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
