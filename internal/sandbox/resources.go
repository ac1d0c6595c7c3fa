package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
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
// errdefs.ErrNotImplemented. Lowering memory below what the sandbox uses
// makes the kernel reclaim and, failing that, the runtime refuses the
// change or the kernel OOM-kills processes inside; the sandbox keeps
// running either way. Growth beyond the host capacity of admission
// control is refused with errdefs.ErrBusy. New timers start the idle clock
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
func (m *Manager) update(ctx context.Context, id string, u Update, members bool) (Sandbox, error) {
	e, sb, unlock, err := m.lockEntry(id)
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

	// Every check first.
	limits := u.Limits != (Limits{})
	next := Limits{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids}
	var upd driver.Updater
	if limits {
		if sb.State != StateRunning && sb.State != StatePaused {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, sb.State)
		}
		if u.Limits.DiskBytes != 0 && u.Limits.DiskBytes != sb.DiskBytes {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "the disk limit of sandbox %s cannot change while it exists", id)
		}
		if next, err = m.boundUpdate(sb, u.Limits); err != nil {
			return Sandbox{}, err
		}
		var ok bool
		if upd, ok = m.drivers[sb.Runtime].(driver.Updater); !ok {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot change the limits of a running sandbox", sb.Runtime)
		}
	}
	timers := u.Lifecycle != (Lifecycle{})
	life, err := m.admitLifecycle(m.drivers[sb.Runtime], mergeLifecycle(sb, u.Lifecycle))
	if err != nil {
		return Sandbox{}, err
	}

	// Then the changes, each with its undo.
	var undo []func()
	rollback := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if limits {
		release, err := m.adm.resize(id, next.MemoryBytes, next.MilliCPUs)
		if err != nil {
			return Sandbox{}, err
		}
		undo = append(undo, release)
		r := driver.Resources{MilliCPUs: next.MilliCPUs, MemoryBytes: next.MemoryBytes, Pids: next.Pids}
		if err := upd.Update(ctx, id, r); err != nil {
			rollback()
			return Sandbox{}, fmt.Errorf("updating limits of sandbox %s: %w", id, err)
		}
		old := driver.Resources{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids}
		undo = append(undo, func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := upd.Update(cctx, id, old); err != nil {
				m.log.Error("restoring limits after a failed update: the runtime's limits differ from the record",
					"sandbox_id", id, "milli_cpus", old.MilliCPUs, "memory_bytes", old.MemoryBytes, "pids", old.Pids, "err", err)
			}
		})
	}

	m.mu.Lock()
	prev := e.sb
	e.sb.MilliCPUs, e.sb.MemoryBytes, e.sb.Pids = next.MilliCPUs, next.MemoryBytes, next.Pids
	e.sb.IdleTimeout, e.sb.OnDeadline, e.sb.OnIdle = *life.IdleTimeout, life.OnDeadline, life.OnIdle
	sb = e.sb.clone()
	m.mu.Unlock()
	undo = append(undo, func() {
		m.mu.Lock()
		e.sb.MilliCPUs, e.sb.MemoryBytes, e.sb.Pids = prev.MilliCPUs, prev.MemoryBytes, prev.Pids
		e.sb.IdleTimeout, e.sb.OnDeadline, e.sb.OnIdle = prev.IdleTimeout, prev.OnDeadline, prev.OnIdle
		m.mu.Unlock()
	})
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		rollback()
		return Sandbox{}, fmt.Errorf("recording the update of sandbox %s: %w", id, err)
	}
	if timers {
		e.act.touch(m.cfg.Now())
	}
	if limits {
		m.log.Info("sandbox limits changed", "sandbox_id", id, "milli_cpus", sb.MilliCPUs,
			"memory_bytes", sb.MemoryBytes, "pids", sb.Pids)
	}
	return sb, nil
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
