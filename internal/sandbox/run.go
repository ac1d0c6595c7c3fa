package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Run creates a sandbox from spec and runs req in it, as Create and then
// Exec do: created gets the new sandbox before fn gets the first of the
// process's events (see Exec). It returns the sandbox whenever one was
// made, also when the exec failed, so that the caller can delete it.
//
// On a cold create whose driver tells when its agent can take requests
// (driver.Spec.Started), req goes to the agent then, while the runtime is
// still starting, and the agent serves it the moment it is ready, instead
// of after the create has been recorded and answered and the exec asked
// for. A warm pool member, a sandbox from a snapshot, a template with a
// service (req waits until the service is ready) and a driver that does
// not tell run req once the create is done.
func (m *Manager) Run(ctx context.Context, spec Spec, req wire.ExecRequest, created func(Sandbox) error, fn func(wire.ExecEvent) error) (Sandbox, error) {
	if err := m.checkExec(&req); err != nil {
		return Sandbox{}, err
	}
	r := newEarlyExec(ctx, m, req, fn)
	defer r.cancel()
	sb, err := m.createWith(ctx, spec, r.start)
	if err != nil {
		r.abandon()
		return Sandbox{}, err
	}
	if err := created(sb); err != nil {
		r.abandon()
		return sb, err
	}
	if r.sent.Load() {
		return sb, r.finish()
	}
	return sb, m.Exec(ctx, sb.ID, req, fn)
}

// earlyExec is Run's request, sent to the agent during the create and
// held back from the caller until the create is done.
type earlyExec struct {
	m      *Manager
	ctx    context.Context
	cancel context.CancelFunc
	req    wire.ExecRequest
	fn     func(wire.ExecEvent) error
	sent   atomic.Bool
	e      *entry        // the sandbox's, once sent
	open   chan struct{} // closed by finish: events may go to fn
	done   chan struct{} // closed when the exec has ended, err set
	err    error
}

func newEarlyExec(ctx context.Context, m *Manager, req wire.ExecRequest, fn func(wire.ExecEvent) error) *earlyExec {
	r := &earlyExec{m: m, req: req, fn: fn, open: make(chan struct{}), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(ctx)
	return r
}

// start sends the request to the agent of e through c; it is create's
// startedFunc.
func (r *earlyExec) start(e *entry, c *agentclient.Client) {
	r.m.mu.RLock()
	t := execTarget{e: e, id: e.sb.ID, runtime: e.sb.Runtime, client: c, early: true}
	r.m.execDefaults(e, &r.req)
	r.m.mu.RUnlock()
	r.e = e
	r.sent.Store(true)
	rec, err := r.m.auditStart(r.ctx, "exec", t.id, r.req)
	if err != nil {
		r.err = err
		close(r.done)
		return
	}
	go func() {
		defer close(r.done)
		start := time.Now()
		var exit *wire.ExecEvent
		// A new sandbox has no OOM kills yet, and its cgroup may not
		// exist at this point to say so.
		r.err = r.m.exec(r.ctx, t, r.req, 0, nil, func(ev wire.ExecEvent) error {
			if ev.Type == wire.EventExit {
				exit = &ev
			}
			select {
			case <-r.open:
			case <-r.ctx.Done():
				return r.ctx.Err()
			}
			return r.fn(ev)
		})
		r.m.auditEnd(rec, start, exit, r.err)
	}()
}

// finish lets the events through to the caller and returns how the exec
// ended, once the create is done: an agent that became unavailable may
// now mean a dead sandbox (see Exec).
func (r *earlyExec) finish() error {
	close(r.open)
	<-r.done
	r.cancel()
	if errors.Is(r.err, errdefs.ErrUnavailable) {
		r.m.checkAlive(context.WithoutCancel(r.ctx), r.e)
	}
	return r.err
}

// abandon ends the exec, if it was sent, and waits for it: the agent
// kills the process when its request goes away.
func (r *earlyExec) abandon() {
	r.cancel()
	if r.sent.Load() {
		<-r.done
	}
}
