package agentserver

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// defaultReadyTimeout bounds the wait for readiness when the request
	// sets none.
	defaultReadyTimeout = 60 * time.Second
	// Restarts back off from minBackoff, doubling up to maxBackoff; a
	// process that ran for backoffReset starts the sequence over.
	minBackoff   = 100 * time.Millisecond
	maxBackoff   = 5 * time.Second
	backoffReset = 10 * time.Second
	// outputTailBytes is how much of the start command's last output a
	// failure message and ServiceStatus.Output carry.
	outputTailBytes = 2 << 10
)

// service is the sandbox's one supervised start command. Its supervisor
// goroutine owns restarts; the request that started it waits for
// readiness; Server.Close stops the supervisor and waits for it.
type service struct {
	spec    procSpec
	restart string
	check   *readyCheck // nil: ready once started

	stop chan struct{} // closed by Server.Close
	done chan struct{} // closed when the supervisor has returned

	mu      sync.Mutex
	st      wire.ServiceStatus
	proc    *process
	changed chan struct{} // closed and replaced whenever st changes
}

// handleStartService serves POST /service: it starts the service and
// answers once it is ready (200 wire.ServiceStatus), or with an error when
// it cannot become ready. The service keeps running either way.
func (s *Server) handleStartService(w http.ResponseWriter, r *http.Request) {
	var req wire.ServiceRequest
	if err := decodeJSON(w, r, &req, maxExecRequest); err != nil {
		wire.WriteError(w, err)
		return
	}
	v, timeout, err := s.newService(&req)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := s.launchService(v); err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := v.waitReady(r.Context(), s, timeout); err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v.status())
}

// handleService serves GET /service.
func (s *Server) handleService(w http.ResponseWriter, _ *http.Request) {
	s.svcMu.Lock()
	v := s.svc
	s.svcMu.Unlock()
	if v == nil {
		wire.WriteError(w, errorf(errdefs.ErrNotFound, "no service was started"))
		return
	}
	writeJSON(w, http.StatusOK, v.status())
}

// newService validates req and returns the service it describes, not yet
// started, with its readiness timeout.
func (s *Server) newService(req *wire.ServiceRequest) (*service, time.Duration, error) {
	restart := req.Restart
	switch restart {
	case "":
		restart = wire.RestartNever
	case wire.RestartNever, wire.RestartOnFailure, wire.RestartAlways:
	default:
		return nil, 0, errorf(errdefs.ErrInvalidArgument, "invalid restart policy %q: want %s, %s or %s",
			restart, wire.RestartNever, wire.RestartOnFailure, wire.RestartAlways)
	}
	if req.ReadyTimeoutMS < 0 {
		return nil, 0, errorf(errdefs.ErrInvalidArgument, "ready_timeout_ms must not be negative")
	}
	timeout := time.Duration(req.ReadyTimeoutMS) * time.Millisecond
	if timeout == 0 {
		timeout = defaultReadyTimeout
	}
	start := req.Start
	start.Stdin, start.TimeoutMS, start.MaxOutputBytes = nil, 0, 0
	spec, err := s.prepareWith(&start, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("service start command: %w", err)
	}
	spec.background, spec.user, spec.tag = true, start.User, wire.ServiceTag
	check, err := s.newReadyCheck(req.Ready, &start)
	if err != nil {
		return nil, 0, err
	}
	v := &service{
		spec: spec, restart: restart, check: check,
		stop: make(chan struct{}), done: make(chan struct{}),
		st:      wire.ServiceStatus{State: wire.ServiceStarting},
		changed: make(chan struct{}),
	}
	return v, timeout, nil
}

// launchService starts v's first process and its supervisor, unless a
// service exists already or the server is closing.
func (s *Server) launchService(v *service) error {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	if s.closed.Load() {
		return errShuttingDown
	}
	if s.svc != nil {
		return errorf(errdefs.ErrAlreadyExists, "a service was started already")
	}
	p, err := s.procs.start(v.spec, nil)
	if err != nil {
		return fmt.Errorf("starting service: %w", err)
	}
	v.proc, v.st.PID = p, p.pid
	s.svc = v
	go v.supervise(s.procs, p)
	return nil
}

// stopService ends the supervisor of the service, if any, and waits for
// it. The processes themselves are killed by the process table's close.
func (s *Server) stopService() {
	s.svcMu.Lock()
	v := s.svc
	s.svcMu.Unlock()
	if v != nil {
		close(v.stop)
		<-v.done
	}
}

// supervise waits for each process of v to end and starts the next one
// as the restart policy says, backing off between starts. Exited
// processes stay in the process table's kept list like any other.
func (v *service) supervise(t *procTable, p *process) {
	defer close(v.done)
	backoff := minBackoff
	for {
		select {
		case <-p.done:
		case <-v.stop:
			return
		}
		failed := p.exit.lost || p.exit.code != 0 || p.exit.signal != ""
		again := v.restart == wire.RestartAlways || (v.restart == wire.RestartOnFailure && failed)
		v.update(func(st *wire.ServiceStatus) {
			st.Signal = p.exit.signal
			st.ExitCode = nil
			if !p.exit.lost {
				code := p.exit.code
				st.ExitCode = &code
			}
			if !again {
				st.State, st.Error = wire.ServiceExited, "start command "+exitText(p.exit)
			}
		})
		if !again {
			return
		}
		if p.exitedAt.Sub(p.startedAt) >= backoffReset {
			backoff = minBackoff
		}
		select {
		case <-time.After(backoff):
		case <-v.stop:
			return
		}
		backoff = min(2*backoff, maxBackoff)
		next, err := t.start(v.spec, nil)
		if err != nil {
			v.update(func(st *wire.ServiceStatus) {
				st.State, st.Error = wire.ServiceExited, "restarting start command: "+err.Error()
			})
			return
		}
		p = next
		v.update(func(st *wire.ServiceStatus) { st.PID, st.Restarts = p.pid, st.Restarts+1 })
		v.mu.Lock()
		v.proc = p
		v.mu.Unlock()
	}
}

// exitText describes how a process ended.
func exitText(e exitStatus) string {
	switch {
	case e.lost:
		return "exited with a lost status"
	case e.signal != "":
		return "was killed by " + e.signal
	default:
		return fmt.Sprintf("exited with code %d", e.code)
	}
}

// update changes v's status under its lock and wakes its waiters.
func (v *service) update(f func(*wire.ServiceStatus)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	f(&v.st)
	close(v.changed)
	v.changed = make(chan struct{})
}

// status describes v; when it is not ready, with its output tail.
func (v *service) status() wire.ServiceStatus {
	v.mu.Lock()
	st, p := v.st, v.proc
	v.mu.Unlock()
	if st.State != wire.ServiceReady {
		st.Output = outputTail(p.out, outputTailBytes)
	}
	return st
}

// waitReady runs v's ready check until it passes, v's command ends for
// good, ctx ends or timeout passes. A service that does not become ready
// is marked failed (unless it exited) and the error, ErrFailedPrecondition,
// carries its exit status and output tail.
func (v *service) waitReady(ctx context.Context, s *Server, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		v.mu.Lock()
		state, changed := v.st.State, v.changed
		v.mu.Unlock()
		if state == wire.ServiceExited {
			return v.notReady("exited before it was ready")
		}
		if v.check == nil || v.check.run(ctx, s) {
			now := time.Now().UTC()
			v.update(func(st *wire.ServiceStatus) {
				if st.State == wire.ServiceStarting {
					st.State, st.ReadyAt = wire.ServiceReady, &now
				}
			})
			return nil
		}
		select {
		case <-time.After(v.check.interval):
		case <-changed:
		case <-ctx.Done():
			why := fmt.Sprintf("was not ready within %s", timeout)
			if ctx.Err() == context.Canceled {
				why = "was not ready when the wait was canceled"
			}
			v.update(func(st *wire.ServiceStatus) {
				if st.State == wire.ServiceStarting {
					st.State, st.Error = wire.ServiceFailed, "service "+why
				}
			})
			return v.notReady(why)
		}
	}
}

// notReady is the error of a service that did not become ready.
func (v *service) notReady(why string) error {
	st := v.status()
	var b strings.Builder
	fmt.Fprintf(&b, "service %s", why)
	if st.State == wire.ServiceExited && st.Error != "" {
		fmt.Fprintf(&b, " (%s)", st.Error)
	} else if st.ExitCode != nil {
		fmt.Fprintf(&b, " (last exit code %d%s)", *st.ExitCode, signalSuffix(st.Signal))
	}
	if st.Output != "" {
		fmt.Fprintf(&b, "; its last output:\n%s", st.Output)
	} else {
		b.WriteString("; it wrote no output")
	}
	return errorf(errdefs.ErrFailedPrecondition, "%s", b.String())
}

func signalSuffix(sig string) string {
	if sig == "" {
		return ""
	}
	return ", " + sig
}

// outputTail returns the last n bytes of l as valid UTF-8: a rune cut at
// the start is dropped, and invalid bytes are removed.
func outputTail(l *outputLog, n int64) string {
	if l == nil {
		return ""
	}
	start, end := l.bounds()
	pos := max(start, end-n)
	var b []byte
	for pos < end {
		pc, _, _, _ := l.next(pos)
		if len(pc.data) == 0 {
			break
		}
		b = append(b, pc.data...)
		pos = pc.off + int64(len(pc.data))
	}
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	return strings.ToValidUTF8(string(b), "")
}
