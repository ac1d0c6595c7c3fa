package sandbox

import (
	"context"
	"fmt"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
)

// move is one state change of a sandbox and what goes with it.
type move struct {
	to State
	// cause, when set, is recorded as the sandbox's Error and passed to
	// the event.
	cause error
	// edit makes further changes to the entry together with the state,
	// under m.mu.
	edit func(*entry)
	// event is emitted once the record is persisted; empty emits none.
	event string
	// undo only sets the state back in memory, neither persisting nor
	// emitting: it reverts a move whose record could not be persisted.
	undo bool
	// observed records a state read from the host by reconcile: the
	// table is not checked (the host is the truth) and no event emitted.
	observed bool
}

// transition moves sandbox e to mv.to: it checks the move against the
// transition table, sets the state, persists the record and emits the
// event. A move the table lacks returns an error wrapping
// errdefs.ErrFailedPrecondition and changes nothing; when the record
// cannot be persisted the state stays set in memory and the event is not
// emitted, for the caller to roll back or report. The caller holds e.op.
func (m *Manager) transition(ctx context.Context, e *entry, mv move) (Sandbox, error) {
	m.mu.Lock()
	if !mv.observed {
		if err := checkMove(e.sb.ID, e.sb.State, mv.to); err != nil {
			m.mu.Unlock()
			return Sandbox{}, err
		}
	}
	e.sb.State = mv.to
	if mv.cause != nil {
		e.sb.Error = mv.cause.Error()
	}
	if mv.edit != nil {
		mv.edit(e)
	}
	sb := e.sb.clone()
	m.mu.Unlock()
	if mv.undo {
		return sb, nil
	}
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording sandbox %s as %s: %w", sb.ID, sb.State, err)
	}
	if mv.event != "" && !mv.observed {
		m.emit(mv.event, sb, mv.cause)
	}
	return sb, nil
}

// entry returns sandbox id's entry if the caller of ctx may see it
// (tenancy.Sees); another tenant's sandbox is not found, as an unknown one.
func (m *Manager) entry(ctx context.Context, id string) (*entry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || !tenancy.Sees(ctx, e.sb.Tenant) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e, nil
}

// lockEntry looks sandbox id up, locks its op and returns its entry, a
// copy of its record and the unlock function. A sandbox deleted while the
// caller waited for op answers errdefs.ErrNotFound, as an unknown one does.
func (m *Manager) lockEntry(ctx context.Context, id string) (*entry, Sandbox, func(), error) {
	e, err := m.entry(ctx, id)
	if err != nil {
		return nil, Sandbox{}, nil, err
	}
	sb, unlock, err := m.lock(e, id)
	if err != nil {
		return nil, Sandbox{}, nil, err
	}
	return e, sb, unlock, nil
}

// lock is lockEntry for a caller that already holds sandbox id's entry.
func (m *Manager) lock(e *entry, id string) (Sandbox, func(), error) {
	if m.beforeLock != nil {
		m.beforeLock(id)
	}
	e.op.Lock()
	sb, err := m.current(e, id)
	if err != nil {
		e.op.Unlock()
		return Sandbox{}, nil, err
	}
	return sb, e.op.Unlock, nil
}

// current returns e's record, or ErrNotFound when the sandbox was deleted
// while the caller waited for e.op.
func (m *Manager) current(e *entry, id string) (Sandbox, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.sandboxes[id] != e {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e.sb.clone(), nil
}
