package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/undo"
)

// MountDetacher is a Mounter that can take a sandbox's mounts down while
// keeping what the mounts hold of the sandbox's own (copy-on-write
// layers), so that the next Prepare of the same mounts shows the changes
// made before. A stopped sandbox's mounts are detached, never released.
type MountDetacher interface {
	// Detach removes the mounts Prepare made for sandbox id and keeps
	// its copy-on-write layers; it is not an error when there is nothing.
	Detach(ctx context.Context, id string) error
}

// stopTimeout bounds a stop or a failed start's rollback, which go on
// when the caller gives up so that no sandbox is left half stopped.
const stopTimeout = 2 * time.Minute

// Stop ends every process of a running or paused sandbox and frees what
// only a running sandbox needs: its instance (the runtime's container and
// cgroup), its admission claim (memory, CPU and the sandbox count; its
// disk stays in use), its network namespace, its host mounts and the
// mount of its root; nothing of it stays in the run dir. The
// record keeps everything StartSandbox needs to boot it again on the same
// root: ID, files, network policy, environment, metadata, limits and
// lifecycle timers. A stopped sandbox has no deadline and no idle timer:
// it stays until it is started or deleted. Stopping a stopped sandbox
// returns it unchanged. The work is not aborted when ctx is canceled
// halfway; a stop that fails leaves the sandbox in the error state, from
// which delete works.
func (m *Manager) Stop(ctx context.Context, id string) (Sandbox, error) {
	e, sb, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.Pool != "" {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if sb.State == StateStopped {
		return sb, nil
	}
	if err := m.canDetach(sb); err != nil {
		return Sandbox{}, err
	}
	if drv, ok := m.drivers[sb.Runtime]; ok && drv.Capabilities().PrivateDisk {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotImplemented, "sandbox %s: runtime %s keeps its writes on a disk of its own, which a stop would lose; pause it or delete it", id, sb.Runtime)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	prev := sb.State
	if sb, err = m.transition(ctx, e, move{to: StateStopping}); err != nil {
		// Not recorded: memory goes back to what the store holds.
		_, _ = m.transition(ctx, e, move{to: prev, undo: true, observed: true})
		return Sandbox{}, err
	}
	if err := m.takeDown(ctx, sb); err != nil {
		m.setError(ctx, e, err)
		return Sandbox{}, err
	}
	m.mu.Lock()
	ag := e.agent
	m.mu.Unlock()
	if ag != nil {
		ag.Close()
	}
	// Nothing runs any more, whether or not the record says so: a
	// record left at stopping is finished by reconcile.
	m.adm.Release(id)
	sb, err = m.transition(ctx, e, move{to: StateStopped, event: events.Stopped, edit: stoppedEntry})
	if err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox stopped", "sandbox_id", id)
	return sb, nil
}

// stoppedEntry clears what only a running sandbox has. The caller holds
// m.mu (move.edit).
func stoppedEntry(e *entry) {
	e.agent, e.netEnv, e.savedPaused = nil, nil, false
	e.oomKills = 0 // the next start's instance counts from 0
	e.sb.Deadline, e.sb.Error = time.Time{}, ""
	e.act.last.Store(0)
}

// canDetach refuses to stop a sandbox whose copy-on-write mounts would
// lose their changes: the Mounter cannot detach them.
func (m *Manager) canDetach(sb Sandbox) error {
	if len(sb.Mounts) == 0 || m.cfg.Mounter == nil {
		return nil
	}
	if _, ok := m.cfg.Mounter.(MountDetacher); ok {
		return nil
	}
	for _, mt := range sb.Mounts {
		if mt.Mode == MountCopyOnWrite {
			return errdefs.Errorf(errdefs.ErrNotImplemented, "sandbox %s: this server cannot keep a cow mount's changes over a stop", sb.ID)
		}
	}
	return nil
}

// takeDown deletes sandbox sb's instance, then detaches its mounts, tears
// down its network and unmounts its root, keeping the root's files. Every
// step is idempotent, so that reconcile can repeat it for a stop or a
// start a crash interrupted.
func (m *Manager) takeDown(ctx context.Context, sb Sandbox) error {
	id := sb.ID
	if drv, ok := m.drivers[sb.Runtime]; ok {
		if err := drv.Delete(ctx, id); err != nil {
			return fmt.Errorf("deleting instance of sandbox %s: %w", id, err)
		}
	}
	var errs []error
	if err := m.detachMounts(ctx, sb); err != nil {
		errs = append(errs, err)
	}
	if m.managedNetwork(sb) {
		if err := m.releaseNetwork(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("releasing network of sandbox %s: %w", id, err))
		}
	}
	if err := m.unmountRoot(ctx, id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// detachMounts takes down the host side of sandbox sb's mounts and keeps
// their copy-on-write layers (MountDetacher), once its instance is gone.
func (m *Manager) detachMounts(ctx context.Context, sb Sandbox) error {
	if len(sb.Mounts) == 0 || m.cfg.Mounter == nil {
		return nil
	}
	d, ok := m.cfg.Mounter.(MountDetacher)
	if !ok {
		return m.releaseMounts(ctx, sb)
	}
	if err := d.Detach(ctx, sb.ID); err != nil {
		return fmt.Errorf("detaching mounts of sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// StartSandbox boots a stopped sandbox again and sets its deadline to now
// plus the server's default timeout, as Resume does; StartFor takes the
// timeout explicitly.
func (m *Manager) StartSandbox(ctx context.Context, id string) (Sandbox, error) {
	return m.StartFor(ctx, id, m.cfg.DefaultTimeout)
}

// StartFor boots stopped sandbox id on its root with its recorded limits,
// network policy, mounts and environment, and sets its deadline to
// now+timeout (0: no deadline, when the server allows it). Admission
// decides as for a create: a full server answers errdefs.ErrBusy. On any
// failure what the start made is undone and the sandbox stays stopped;
// the error says why. Starting a running sandbox returns it unchanged.
func (m *Manager) StartFor(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	deadline, err := m.deadline(m.cfg.Now(), timeout)
	if err != nil {
		return Sandbox{}, err
	}
	e, sb, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	switch {
	case sb.Pool != "":
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	case sb.State == StateRunning:
		return sb, nil
	case sb.State != StateStopped:
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not stopped", id, sb.State)
	}
	drv, ok := m.drivers[sb.Runtime]
	if !ok {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s: runtime %q is not available on this daemon", id, sb.Runtime)
	}
	releaseQuota, err := m.reserveMore(ctx, usage{memory: sb.MemoryBytes, milliCPUs: sb.MilliCPUs})
	if err != nil {
		return Sandbox{}, err
	}
	defer releaseQuota()
	done, err := m.adm.Reserve(ctx, id, claimOf(sb))
	if err != nil {
		return Sandbox{}, err
	}
	defer done()
	begin := time.Now()
	out, err := m.boot(ctx, e, drv, sb, deadline)
	if err != nil {
		m.log.Warn("sandbox start failed; it stays stopped", "sandbox_id", id, "err", err)
		return Sandbox{}, err
	}
	m.log.Info("sandbox started", "sandbox_id", id, "runtime", out.Runtime, "duration_ms", time.Since(begin).Milliseconds())
	return out, nil
}

// boot is StartFor once admission holds sb's claim: on failure it undoes
// what it made, newest first, and leaves the sandbox stopped without a
// claim. The caller holds e.op.
func (m *Manager) boot(ctx context.Context, e *entry, drv driver.Driver, sb Sandbox, deadline time.Time) (_ Sandbox, err error) {
	id := sb.ID
	var u undo.Stack
	defer func() {
		if err == nil {
			u.Keep()
			return
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if uerr := u.Undo(uctx); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	u.Add(func(context.Context) error { m.adm.Release(id); return nil })
	// Back to stopped whatever state the start reached; observed, since
	// a record that failed to persist leaves its state in memory.
	u.Add(func(ctx context.Context) error {
		_, err := m.transition(ctx, e, move{to: StateStopped, observed: true, edit: stoppedEntry})
		return err
	})
	if sb, err = m.transition(ctx, e, move{to: StateStarting}); err != nil {
		return Sandbox{}, err
	}
	set := setupResult{sb: sb}
	// The instance's host IDs went with it at stop; the new ones come
	// before the root, which is shown through them.
	idmap, err := m.reserveIDs(ctx, &u, sb)
	if err != nil {
		return Sandbox{}, err
	}
	set.root, err = m.mountRoot(ctx, id, idmap)
	if idmap != nil {
		idmap.Close()
	}
	if err != nil {
		return Sandbox{}, err
	}
	u.Add(func(ctx context.Context) error { return m.unmountRoot(ctx, id) })
	if set.network, err = m.setupNetwork(ctx, sb); err != nil {
		return Sandbox{}, err
	}
	u.Add(func(ctx context.Context) error { return m.releaseNetwork(ctx, id) })
	if set.mounts, err = m.hostMounts(ctx, drv, sb, set.root); err != nil {
		return Sandbox{}, err
	}
	u.Add(func(ctx context.Context) error { return m.detachMounts(ctx, sb) })
	ag := m.newAgent(drv, id)
	u.Add(func(context.Context) error { ag.Close(); return nil })
	if err := m.launch(ctx, &u, drv, e, ag, set, nil, nil); err != nil {
		return Sandbox{}, err
	}
	if err := ctx.Err(); err != nil {
		return Sandbox{}, fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	if err := m.startService(ctx, ag, sb, netEnvOf(set.network), m.serviceToStart(sb.Template, nil)); err != nil {
		return Sandbox{}, err
	}
	m.warmAgent(ag)
	return m.transition(ctx, e, move{to: StateRunning, event: events.Started, edit: func(e *entry) {
		e.agent, e.sb.Deadline = ag, deadline
		if set.network != nil {
			e.netEnv = set.network.Env
		}
	}})
}

// mountRoot returns the host path of sandbox id's root, mounted again,
// through idmap when it is not nil (storage.RootOptions.IDMap), when the
// backend's mount of it is gone (a stop, a host reboot).
func (m *Manager) mountRoot(ctx context.Context, id string, idmap *os.File) (string, error) {
	if rm, ok := m.cfg.Storage.(storage.RootMounter); ok {
		root, err := rm.MountRoot(ctx, id, idmap)
		if err != nil {
			return "", fmt.Errorf("mounting root of sandbox %s: %w", id, err)
		}
		return root, nil
	}
	root := m.cfg.Storage.RootPath(id)
	if _, err := os.Stat(root); err != nil {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "root of sandbox %s: %v", id, err)
	}
	return root, nil
}

// unmountRoot unmounts sandbox id's root, keeping its files, on backends
// whose roots are mounts.
func (m *Manager) unmountRoot(ctx context.Context, id string) error {
	rm, ok := m.cfg.Storage.(storage.RootMounter)
	if !ok {
		return nil
	}
	if err := rm.UnmountRoot(ctx, id); err != nil {
		return fmt.Errorf("unmounting root of sandbox %s: %w", id, err)
	}
	return nil
}

// notRunning is the error of an operation that needs a running sandbox
// id, which is in state st.
func notRunning(id string, st State) error {
	if st == StateStopped {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is stopped; start it first", id)
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, st)
}

// resting reports whether a sandbox in state st is stopped or on its way
// to or from it: no lifecycle timer fires for it.
func resting(st State) bool {
	return st == StateStopping || st == StateStopped || st == StateStarting
}

// stopFor carries out ActionStop for timer t and reports whether the
// timer is done. An idle stop that fails is logged and tried again after
// another idle period; a deadline whose stop fails falls through to the
// destroy (false), so that a deadline always ends in the sandbox stopped
// or gone.
func (m *Manager) stopFor(ctx context.Context, t timer, log *slog.Logger) bool {
	_, err := m.Stop(ctx, t.id)
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		log.Info("sandbox timer fired")
		return true
	}
	if t.reason == "idle" {
		log.Error("stopping idle sandbox", "err", err)
		if e, eerr := m.entry(ctx, t.id); eerr == nil {
			e.act.touch(m.cfg.Now())
		}
		return true
	}
	log.Error("stopping sandbox at its deadline; destroying it instead", "err", err)
	return false
}
