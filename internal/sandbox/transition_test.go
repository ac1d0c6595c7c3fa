package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
)

// TestTransition checks that transition refuses a move the table lacks,
// and otherwise sets, persists and emits exactly what the move says.
func TestTransition(t *testing.T) {
	boom := errors.New("disk full")
	tests := []struct {
		name      string
		mv        move
		failPut   bool
		wantErr   error
		wantMem   State
		wantStore State
		wantEvent string
	}{
		{name: "legal move", mv: move{to: StatePaused, event: events.Paused},
			wantMem: StatePaused, wantStore: StatePaused, wantEvent: events.Paused},
		{name: "move without event", mv: move{to: StateDeleting},
			wantMem: StateDeleting, wantStore: StateDeleting},
		{name: "illegal move", mv: move{to: StateCreating, event: events.Running},
			wantErr: errdefs.ErrFailedPrecondition, wantMem: StateRunning, wantStore: StateRunning},
		{name: "undo sets memory only", mv: move{to: StateError, event: events.Error, undo: true},
			wantMem: StateError, wantStore: StateRunning},
		{name: "failed persist emits nothing", mv: move{to: StateError, cause: boom, event: events.Error}, failPut: true,
			wantErr: boom, wantMem: StateError, wantStore: StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			ctx := t.Context()
			sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
			if err != nil {
				t.Fatal(err)
			}
			sub := h.m.Events().Subscribe(events.Filter{})
			defer sub.Close()
			if tt.failPut {
				h.store.mu.Lock()
				h.store.failPut = func(Sandbox) error { return boom }
				h.store.mu.Unlock()
				defer func() {
					h.store.mu.Lock()
					h.store.failPut = nil
					h.store.mu.Unlock()
				}()
			}
			e, _, unlock, err := h.m.lockEntry(context.Background(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			_, err = h.m.transition(ctx, e, tt.mv)
			unlock()
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("transition error %v, want %v", err, tt.wantErr)
			}
			if got, _ := h.m.Get(context.Background(), sb.ID); got.State != tt.wantMem {
				t.Errorf("state in memory %s, want %s", got.State, tt.wantMem)
			}
			if got := h.store.sandbox(sb.ID).State; got != tt.wantStore {
				t.Errorf("state in the store %s, want %s", got, tt.wantStore)
			}
			var got string
			select {
			case ev := <-sub.C():
				got = ev.Type
			default:
			}
			if got != tt.wantEvent {
				t.Errorf("event %q, want %q", got, tt.wantEvent)
			}
		})
	}
}
