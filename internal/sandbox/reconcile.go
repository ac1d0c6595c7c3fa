package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/driver"
)

// reconcile makes memory, the store and the host agree after a start:
//   - sandboxes recorded as creating or deleting were interrupted: their
//     resources are released and the record dropped;
//   - sandboxes recorded as running or paused whose instance still runs are
//     reattached; those whose instance is gone are released and dropped;
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
				if err := m.release(ctx, sb.Runtime, sb.ID); err != nil {
					return fmt.Errorf("releasing sandbox %s: %w", sb.ID, err)
				}
				if err := m.cfg.Store.DeleteSandbox(ctx, sb.ID); err != nil {
					return fmt.Errorf("forgetting sandbox %s: %w", sb.ID, err)
				}
				continue
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
		e := &entry{sb: sb}
		if _, err := m.transition(ctx, e, mv); err != nil {
			return err
		}
		if drv != nil {
			e.agent = m.newAgent(drv, sb.ID)
		}
		m.sandboxes[sb.ID] = e
	}
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
	return m.reconcileNetworks(ctx)
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
func recoverAction(rec State, st driver.Status) (recovery, State) {
	switch {
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

// reapLoop fires the lifecycle timers that are due (reapExpired), until
// Close.
func (m *Manager) reapLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.reapExpired()
		}
	}
}
