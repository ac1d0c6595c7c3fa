package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
)

// Pause freezes every process of a running sandbox (the freezer cgroup
// for runc, gVisor's own pause). Its memory stays in use; exec and file
// calls fail with ErrFailedPrecondition until Resume. The deadline keeps
// running. Drivers without the ability return ErrNotImplemented.
func (m *Manager) Pause(ctx context.Context, id string) (Sandbox, error) {
	e, sb, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.State == StateStopped {
		return Sandbox{}, notRunning(id, sb.State)
	}
	if err := checkMove(id, sb.State, StatePaused); err != nil { // before the driver freezes it
		return Sandbox{}, err
	}
	p, err := m.driverPauser(sb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Pause(ctx, id); err != nil {
		return Sandbox{}, fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	sb, err = m.transition(ctx, e, move{to: StatePaused, event: events.Paused})
	if err != nil {
		rerr := p.Resume(context.WithoutCancel(ctx), id)
		if _, uerr := m.transition(ctx, e, move{to: StateRunning, undo: true}); uerr != nil {
			rerr = errors.Join(rerr, uerr)
		}
		return Sandbox{}, errors.Join(err, rerr)
	}
	m.log.Info("sandbox paused", "sandbox_id", id)
	return sb, nil
}

// Resume thaws a paused sandbox and sets its deadline to now plus the
// server's default timeout, so that a sandbox paused at its deadline does
// not expire at once; ResumeFor takes the timeout explicitly.
func (m *Manager) Resume(ctx context.Context, id string) (Sandbox, error) {
	return m.ResumeFor(ctx, id, m.cfg.DefaultTimeout)
}

// ResumeFor thaws a paused sandbox and sets its deadline to now+timeout
// (0: no deadline, when the server allows it), as SetTimeout does.
func (m *Manager) ResumeFor(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	deadline, err := m.deadline(m.cfg.Now(), timeout)
	if err != nil {
		return Sandbox{}, err
	}
	e, sb, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.State != StatePaused {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not paused", id, sb.State)
	}
	p, err := m.driverPauser(sb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Resume(ctx, id); err != nil {
		return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	e.savedPaused = false
	sb, err = m.transition(ctx, e, move{to: StateRunning, event: events.Resumed, edit: func(e *entry) { e.sb.Deadline = deadline }})
	if err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox resumed", "sandbox_id", id)
	return sb, nil
}

func (m *Manager) driverPauser(sb Sandbox) (driver.Pauser, error) {
	p, ok := m.drivers[sb.Runtime].(driver.Pauser)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot pause sandboxes", sb.Runtime)
	}
	return p, nil
}
