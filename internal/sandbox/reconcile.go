package sandbox

import (
	"context"
	"fmt"

	"github.com/corralrun/corral/internal/driver"
)

// reconcile makes memory, the store and the host agree after a start:
//   - sandboxes recorded as creating or deleting were interrupted: their
//     resources are released and the record dropped;
//   - sandboxes recorded as running or paused whose instance still runs are
//     reattached; those whose instance is gone are released and dropped;
//   - sandboxes recorded as stopping, stopped or starting are kept stopped,
//     with nothing of them running (finishStop);
//   - instances and roots that no record names are released;
//   - templates in storage that the store lacks are recorded, and records
//     whose tree is gone are dropped;
//   - networks of kept sandboxes are adopted, all others removed
//     (reconcileNetworks).
func (m *Manager) reconcile(ctx context.Context) error {
	if err := m.reconcileTemplates(ctx); err != nil {
		return err
	}
	recs, err := m.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("loading sandboxes: %w", err)
	}
	known := make(map[string]bool, len(recs))
	for _, sb := range recs {
		known[sb.ID] = true
		drv, ok := m.drivers[sb.Runtime]
		var mv move
		switch {
		case !ok && resting(sb.State): // Start names the missing runtime
			mv = m.finishStop(ctx, sb)
		case !ok:
			m.log.Warn("sandbox has an unavailable runtime; keeping it as error", "sandbox_id", sb.ID, "runtime", sb.Runtime)
			mv = move{to: StateError, cause: fmt.Errorf("runtime %q is not available on this daemon", sb.Runtime)}
		default:
			var st driver.Status
			if asksDriver(sb.State) {
				if st, err = drv.Status(ctx, sb.ID); err != nil {
					return fmt.Errorf("checking sandbox %s: %w", sb.ID, err)
				}
			}
			act, to := recoverAction(sb.State, st)
			if act == recoverRelease {
				m.log.Info("releasing interrupted or stopped sandbox", "sandbox_id", sb.ID, "state", sb.State.String())
				if err := m.release(ctx, sb); err != nil {
					return fmt.Errorf("releasing sandbox %s: %w", sb.ID, err)
				}
				if err := m.cfg.Store.DeleteSandbox(ctx, sb.ID); err != nil {
					return fmt.Errorf("forgetting sandbox %s: %w", sb.ID, err)
				}
				continue
			}
			if act == recoverStop {
				mv = m.finishStop(ctx, sb)
				break
			}
			if act == recoverThaw {
				if err := m.thaw(ctx, drv, sb.ID); err != nil {
					m.log.Error("resuming sandbox frozen by an interrupted operation", "sandbox_id", sb.ID, "err", err)
					to = StatePaused
				}
			}
			mv = move{to: to}
		}
		mv.observed = true
		e := &entry{sb: sb, oomKills: -1}
		if _, err := m.transition(ctx, e, mv); err != nil {
			return err
		}
		if drv != nil && e.sb.State != StateStopped {
			e.agent = m.newAgent(drv, sb.ID)
		}
		m.sandboxes[sb.ID] = e
	}
	if err := m.removeOrphans(ctx, known); err != nil {
		return err
	}
	return m.reconcileNetworks(ctx)
}

// removeOrphans deletes the instances, mounts and roots whose sandbox ID is not
// in known: what a crash left of a create before its record was in.
func (m *Manager) removeOrphans(ctx context.Context, known map[string]bool) error {
	for name, drv := range m.drivers {
		ids, err := drv.List(ctx)
		if err != nil {
			return fmt.Errorf("listing %s instances: %w", name, err)
		}
		for _, id := range ids {
			if !known[id] {
				m.log.Info("deleting orphaned instance", "sandbox_id", id, "driver", name)
				if err := drv.Delete(ctx, id); err != nil {
					return fmt.Errorf("deleting orphaned instance %s: %w", id, err)
				}
			}
		}
	}
	if m.cfg.Mounter != nil {
		if err := m.cfg.Mounter.Sweep(ctx, func(id string) bool { return known[id] }); err != nil {
			return fmt.Errorf("removing orphaned mounts: %w", err)
		}
	}
	roots, err := m.cfg.Storage.Roots(ctx)
	if err != nil {
		return fmt.Errorf("listing roots: %w", err)
	}
	for _, id := range roots {
		if !known[id] {
			m.log.Info("deleting orphaned root", "sandbox_id", id)
			if err := m.cfg.Storage.DeleteRoot(ctx, id); err != nil {
				return fmt.Errorf("deleting orphaned root %s: %w", id, err)
			}
		}
	}
	return nil
}

// recovery is what reconcile does with a recorded sandbox.
type recovery int

const (
	// recoverRelease releases the sandbox's resources and drops its record.
	recoverRelease recovery = iota + 1
	// recoverKeep keeps the sandbox in the state recoverAction returns.
	recoverKeep
	// recoverThaw thaws the instance, then keeps the sandbox running, or
	// paused when the thaw fails.
	recoverThaw
	// recoverStop takes down whatever runs of the sandbox, keeping its
	// root, and keeps it stopped (finishStop).
	recoverStop
)

// asksDriver reports whether reconcile needs the driver's status of a
// sandbox recorded in state rec: creating and deleting ones were
// interrupted and are released whatever their instance does.
func asksDriver(rec State) bool {
	return rec == StateRunning || rec == StatePaused || rec == StateError
}

// recoverAction decides what reconcile does with a sandbox recorded in
// state rec whose instance has status st (zero when asksDriver is false),
// and the state it keeps the sandbox in. A running instance is kept
// running whatever was recorded; one frozen while recorded running was
// frozen by a snapshot or pause the daemon did not finish, and is thawed.
// A stop or a start that the daemon did not finish ends stopped: the stop
// is finished, the start undone.
func recoverAction(rec State, st driver.Status) (recovery, State) {
	switch {
	case rec == StateStopping || rec == StateStopped || rec == StateStarting:
		return recoverStop, StateStopped
	case !asksDriver(rec):
		return recoverRelease, rec
	case st == driver.StatusRunning:
		return recoverKeep, StateRunning
	case st == driver.StatusPaused && rec == StateRunning:
		return recoverThaw, StateRunning
	case st == driver.StatusPaused:
		return recoverKeep, StatePaused
	case rec == StateError:
		return recoverKeep, StateError
	}
	return recoverRelease, rec
}

func (m *Manager) reconcileTemplates(ctx context.Context) error {
	recs, err := m.cfg.Store.Templates(ctx)
	if err != nil {
		return fmt.Errorf("loading templates: %w", err)
	}
	names, err := m.cfg.Storage.Templates(ctx)
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	onDisk := make(map[string]bool, len(names))
	for _, n := range names {
		onDisk[n] = true
	}
	for _, t := range recs {
		if !onDisk[t.Name] {
			m.log.Warn("template record without a tree; dropping it", "template", t.Name)
			if err := m.cfg.Store.DeleteTemplate(ctx, t.Name); err != nil {
				return err
			}
			continue
		}
		m.templates[t.Name] = t
	}
	for _, n := range names {
		if _, ok := m.templates[n]; !ok {
			t := Template{Name: n, Source: "unknown", CreatedAt: m.cfg.Now().UTC()}
			if err := m.cfg.Store.PutTemplate(ctx, t); err != nil {
				return err
			}
			m.templates[n] = t
		}
	}
	return nil
}

// thaw resumes the instance of sandbox id, which the store records as
// running, after a restart.
func (m *Manager) thaw(ctx context.Context, drv driver.Driver, id string) error {
	p, ok := drv.(driver.Pauser)
	if !ok {
		return fmt.Errorf("sandbox %s is paused and runtime %s cannot resume it", id, drv.Name())
	}
	m.log.Info("resuming sandbox frozen by an interrupted operation", "sandbox_id", id)
	if err := p.Resume(ctx, id); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return nil
}

// finishStop makes sure that nothing of sandbox sb runs, mounts or holds a
// network (takeDown), and returns the move that records it stopped; when
// that fails the sandbox is kept as error, which delete cleans up. Its
// network goes in any case: reconcileNetworks keeps none of a stopped
// sandbox.
func (m *Manager) finishStop(ctx context.Context, sb Sandbox) move {
	if sb.State != StateStopped {
		m.log.Info("finishing an interrupted stop or start; the sandbox stays stopped", "sandbox_id", sb.ID, "state", sb.State.String())
	}
	if err := m.takeDown(ctx, sb); err != nil {
		m.log.Error("taking down a stopped sandbox", "sandbox_id", sb.ID, "err", err)
		return move{to: StateError, cause: err}
	}
	return move{to: StateStopped, edit: stoppedEntry}
}
