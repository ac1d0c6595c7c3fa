package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/events"
)

// Delete destroys a sandbox and releases everything it holds. It works from
// every state and is idempotent: deleting an unknown ID returns an error
// wrapping errdefs.ErrNotFound and changes nothing. The work is not aborted
// when ctx is canceled halfway, so a client that goes away cannot leave a
// half-deleted sandbox.
func (m *Manager) Delete(ctx context.Context, id string) error {
	e, _, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	sb, err := m.transition(ctx, e, move{to: StateDeleting})
	if err != nil {
		return err
	}
	if err := m.release(ctx, sb); err != nil {
		m.setError(ctx, e, err)
		return err
	}
	if e.agent != nil {
		e.agent.Close()
	}
	m.forget(ctx, id)
	m.emit(events.Deleted, sb, nil)
	if m.managedNetwork(sb) {
		m.releaseNetworkLater(id)
	}
	m.log.Info("sandbox deleted", "sandbox_id", id)
	return nil
}

// release frees the instance, the mounts and the root of sandbox sb. The
// mounts stay while the instance may still run: a later delete or
// reconcile releases them.
func (m *Manager) release(ctx context.Context, sb Sandbox) error {
	id := sb.ID
	var errs []error
	if drv, ok := m.drivers[sb.Runtime]; ok {
		if err := drv.Delete(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("deleting instance of sandbox %s: %w", id, err))
		}
	}
	if len(errs) == 0 {
		if err := m.releaseMounts(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.cfg.Storage.DeleteRoot(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("deleting root of sandbox %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// forget drops a sandbox from memory and the store.
func (m *Manager) forget(ctx context.Context, id string) {
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.mu.Unlock()
	m.adm.Release(id)
	if err := m.cfg.Store.DeleteSandbox(ctx, id); err != nil {
		m.log.Error("forgetting sandbox", "sandbox_id", id, "err", err)
	}
}

func (m *Manager) setError(ctx context.Context, e *entry, cause error) {
	if _, err := m.transition(ctx, e, move{to: StateError, cause: cause, event: events.Error}); err != nil {
		m.log.Error("recording sandbox error", "sandbox_id", e.sb.ID, "err", err)
	}
}
