package sandbox

import (
	"context"
	"fmt"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// UpdateResources changes the CPU, memory and pids limits of a running or
// paused sandbox and records them. Zero fields of l keep the current value;
// a limit cannot be lifted to unlimited here. Each new value is checked
// against the server maximum as at create. The disk limit cannot change
// (l.DiskBytes must be zero or the current value). The runtime must
// implement driver.Updater; otherwise the error wraps
// errdefs.ErrNotImplemented.
//
// Lowering memory below what the sandbox uses makes the kernel reclaim
// and, failing that, the runtime refuses the change or the kernel
// OOM-kills processes inside; the sandbox keeps running either way. Growth
// beyond the host capacity of admission control is refused with
// errdefs.ErrBusy. It serializes with other lifecycle operations on the
// same sandbox.
func (m *Manager) UpdateResources(ctx context.Context, id string, l Limits) (Sandbox, error) {
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.op.Lock()
	defer e.op.Unlock()

	m.mu.RLock()
	sb, current := e.sb.clone(), m.sandboxes[id] == e
	m.mu.RUnlock()
	if !current { // deleted while we waited for op
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if sb.State != StateRunning && sb.State != StatePaused {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, sb.State)
	}
	if l.DiskBytes != 0 && l.DiskBytes != sb.DiskBytes {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "the disk limit of sandbox %s cannot change while it exists", id)
	}
	next, err := m.boundUpdate(sb, l)
	if err != nil {
		return Sandbox{}, err
	}
	upd, ok := m.drivers[sb.Runtime].(driver.Updater)
	if !ok {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot change the limits of a running sandbox", sb.Runtime)
	}
	undo, err := m.adm.resize(id, next.MemoryBytes, next.MilliCPUs)
	if err != nil {
		return Sandbox{}, err
	}
	r := driver.Resources{MilliCPUs: next.MilliCPUs, MemoryBytes: next.MemoryBytes, Pids: next.Pids}
	if err := upd.Update(ctx, id, r); err != nil {
		undo()
		return Sandbox{}, fmt.Errorf("updating limits of sandbox %s: %w", id, err)
	}

	m.mu.Lock()
	e.sb.MilliCPUs, e.sb.MemoryBytes, e.sb.Pids = next.MilliCPUs, next.MemoryBytes, next.Pids
	sb = e.sb.clone()
	m.mu.Unlock()
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording limits of sandbox %s: %w", id, err)
	}
	m.log.Info("sandbox limits changed", "sandbox_id", id, "milli_cpus", sb.MilliCPUs,
		"memory_bytes", sb.MemoryBytes, "pids", sb.Pids)
	return sb, nil
}

// boundUpdate merges l into sb's limits and checks them against Max.
func (m *Manager) boundUpdate(sb Sandbox, l Limits) (Limits, error) {
	next := Limits{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes}
	for _, f := range []struct {
		name     string
		v, limit int64
		dst      *int64
	}{
		{"cpus (millicpus)", l.MilliCPUs, m.cfg.Max.MilliCPUs, &next.MilliCPUs},
		{"memory (bytes)", l.MemoryBytes, m.cfg.Max.MemoryBytes, &next.MemoryBytes},
		{"pids", l.Pids, m.cfg.Max.Pids, &next.Pids},
	} {
		switch {
		case f.v < 0:
			return next, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s must not be negative", f.name)
		case f.v == 0:
			continue
		case f.limit > 0 && f.v > f.limit:
			return next, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %d exceeds the server maximum %d", f.name, f.v, f.limit)
		}
		*f.dst = f.v
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < 16<<20 {
		return next, errdefs.Errorf(errdefs.ErrInvalidArgument, "memory %d bytes is below the minimum of 16 MiB", l.MemoryBytes)
	}
	return next, nil
}
