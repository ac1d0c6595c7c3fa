package sandbox

import (
	"context"
	"fmt"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

// Update is a change of a sandbox's limits and lifecycle timers
// (Manager.Update).
type Update struct {
	// Limits are new CPU, memory and pids limits: zero fields keep their
	// value, and a limit cannot be lifted to unlimited. The disk limit
	// cannot change (DiskBytes must be zero or the current value).
	Limits Limits
	// Lifecycle holds new timers, as for SetLifecycle.
	Lifecycle Lifecycle
}

// Update changes a sandbox's limits and lifecycle timers together and
// records them, all or nothing: every value is checked against its range
// and the server maximum before anything changes, and when a change then
// fails (the runtime refuses a limit, the record cannot be written), the
// changes made before it are undone, so that the record and the runtime's
// limits agree.
//
// Limits change only while the sandbox runs or is paused, and only on a
// runtime that implements driver.Updater; otherwise the error wraps
// errdefs.ErrNotImplemented. A stopped sandbox's new limits are recorded
// and take effect at its next start, whose admission checks them. Lowering memory below what the sandbox uses
// makes the kernel reclaim and, failing that, the runtime refuses the
// change or the kernel OOM-kills processes inside; the sandbox keeps
// running either way. Growth beyond the host capacity of admission
// control is refused with errdefs.ErrBusy, and beyond the caller's
// tenant's quota with errdefs.ErrResourceExhausted. New timers start the idle clock
// again; the deadline changes only through SetTimeout. Update serializes
// with other lifecycle operations on the same sandbox.
func (m *Manager) Update(ctx context.Context, id string, u Update) (Sandbox, error) {
	return m.update(ctx, id, u, false)
}

// UpdateResources is Update of the limits alone. Unlike Update it also
// changes a warm pool member's, for a claim (handOut).
func (m *Manager) UpdateResources(ctx context.Context, id string, l Limits) (Sandbox, error) {
	return m.update(ctx, id, Update{Limits: l}, true)
}

// SetLifecycle is Update of the idle timeout and timer actions alone (nil
// and empty fields of l keep their value), which may change in any state
// but creating and deleting. The idle clock starts again from now.
func (m *Manager) SetLifecycle(ctx context.Context, id string, l Lifecycle) (Sandbox, error) {
	return m.update(ctx, id, Update{Lifecycle: l}, false)
}

// update is Update; members allows warm pool members.
func (m *Manager) update(ctx context.Context, id string, u Update, members bool) (_ Sandbox, err error) {
	e, sb, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.Pool != "" && !members { // hidden
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if sb.State == StateCreating || sb.State == StateDeleting {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s", id, sb.State)
	}
	// Every check first, then the changes, each with its undo.
	p, err := m.planUpdate(sb, u)
	if err != nil {
		return Sandbox{}, err
	}
	var rollback undo.Stack
	defer rollback.OnError(ctx, &err)
	if p.upd != nil {
		// A stopped sandbox holds no memory or CPU: its start checks them.
		grow := usage{memory: max(0, p.limits.MemoryBytes-sb.MemoryBytes), milliCPUs: max(0, p.limits.MilliCPUs-sb.MilliCPUs)}
		releaseQuota, err := m.reserveMore(ctx, grow)
		if err != nil {
			return Sandbox{}, err
		}
		defer releaseQuota()
		if err := m.applyLimits(ctx, &rollback, sb, p); err != nil {
			return Sandbox{}, err
		}
	}

	m.mu.Lock()
	prev := e.sb
	e.sb.MilliCPUs, e.sb.MemoryBytes, e.sb.Pids = p.limits.MilliCPUs, p.limits.MemoryBytes, p.limits.Pids
	e.sb.IdleTimeout, e.sb.OnDeadline, e.sb.OnIdle = *p.life.IdleTimeout, p.life.OnDeadline, p.life.OnIdle
	sb = e.sb.clone()
	m.mu.Unlock()
	rollback.Add(func(context.Context) error {
		m.mu.Lock()
		e.sb.MilliCPUs, e.sb.MemoryBytes, e.sb.Pids = prev.MilliCPUs, prev.MemoryBytes, prev.Pids
		e.sb.IdleTimeout, e.sb.OnDeadline, e.sb.OnIdle = prev.IdleTimeout, prev.OnDeadline, prev.OnIdle
		m.mu.Unlock()
		return nil
	})
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording the update of sandbox %s: %w", id, err)
	}
	if u.Lifecycle != (Lifecycle{}) {
		e.act.touch(m.cfg.Now())
	}
	if p.upd != nil {
		m.log.Info("sandbox limits changed", "sandbox_id", id, "milli_cpus", sb.MilliCPUs,
			"memory_bytes", sb.MemoryBytes, "pids", sb.Pids)
	}
	return sb, nil
}

// updatePlan is an Update checked against a sandbox: the limits and
// timers the sandbox ends with, and the driver that changes the limits
// (nil when the Update leaves them).
type updatePlan struct {
	limits Limits
	life   Lifecycle
	upd    driver.Updater
}

// planUpdate checks u against sandbox sb, changing nothing.
func (m *Manager) planUpdate(sb Sandbox, u Update) (updatePlan, error) {
	p := updatePlan{limits: Limits{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids}}
	if u.Limits != (Limits{}) {
		if sb.State != StateRunning && sb.State != StatePaused && sb.State != StateStopped {
			return p, notRunning(sb.ID, sb.State)
		}
		if u.Limits.DiskBytes != 0 && u.Limits.DiskBytes != sb.DiskBytes {
			return p, errdefs.Errorf(errdefs.ErrInvalidArgument, "the disk limit of sandbox %s cannot change while it exists", sb.ID)
		}
		var err error
		if p.limits, err = m.boundUpdate(sb, u.Limits); err != nil {
			return p, err
		}
		var ok bool
		if sb.State == StateStopped { // recorded for the next start
			return m.planLifecycle(sb, u, p)
		}
		if p.upd, ok = m.drivers[sb.Runtime].(driver.Updater); !ok {
			return p, errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot change the limits of a running sandbox", sb.Runtime)
		}
	}
	return m.planLifecycle(sb, u, p)
}

// planLifecycle checks u's timers against sb and adds them to p.
func (m *Manager) planLifecycle(sb Sandbox, u Update, p updatePlan) (updatePlan, error) {
	life, err := m.admitLifecycle(m.drivers[sb.Runtime], mergeLifecycle(sb, u.Lifecycle))
	if err != nil {
		return p, err
	}
	p.life = life
	return p, nil
}

// applyLimits changes sandbox sb's admission claim and runtime limits to
// p's, registering on u how to restore each. A runtime that cannot take
// the old limits back is logged: the record keeps them, so the two then
// differ.
func (m *Manager) applyLimits(ctx context.Context, u *undo.Stack, sb Sandbox, p updatePlan) error {
	id, next := sb.ID, p.limits
	restore, err := m.adm.Resize(id, next.MemoryBytes, next.MilliCPUs)
	if err != nil {
		return err
	}
	u.Add(func(context.Context) error { restore(); return nil })
	r := driver.Resources{MilliCPUs: next.MilliCPUs, MemoryBytes: next.MemoryBytes, Pids: next.Pids}
	if err := p.upd.Update(ctx, id, r); err != nil {
		return fmt.Errorf("updating limits of sandbox %s: %w", id, err)
	}
	old := driver.Resources{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids}
	u.Add(func(ctx context.Context) error {
		if err := p.upd.Update(ctx, id, old); err != nil {
			m.log.Error("restoring limits after a failed update: the runtime's limits differ from the record",
				"sandbox_id", id, "milli_cpus", old.MilliCPUs, "memory_bytes", old.MemoryBytes, "pids", old.Pids, "err", err)
		}
		return nil
	})
	return nil
}

// mergeLifecycle returns sb's timers with the set fields of l.
func mergeLifecycle(sb Sandbox, l Lifecycle) Lifecycle {
	merged := Lifecycle{IdleTimeout: &sb.IdleTimeout, OnDeadline: sb.OnDeadline, OnIdle: sb.OnIdle}
	if l.IdleTimeout != nil {
		merged.IdleTimeout = l.IdleTimeout
	}
	if l.OnDeadline != "" {
		merged.OnDeadline = l.OnDeadline
	}
	if l.OnIdle != "" {
		merged.OnIdle = l.OnIdle
	}
	return merged
}

// boundUpdate merges l into sb's limits and checks each new value against
// its range and the server maximum.
func (m *Manager) boundUpdate(sb Sandbox, l Limits) (Limits, error) {
	next := Limits{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes}
	asked := l
	fields, current := m.limitFields(&asked), m.limitFields(&next)
	for i, f := range fields[:3] { // the disk limit does not change
		if *f.v == 0 {
			continue
		}
		if err := f.check(*f.v); err != nil {
			return next, err
		}
		*current[i].v = *f.v
	}
	return next, nil
}
