package sandbox

import (
	"context"
	"fmt"
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
