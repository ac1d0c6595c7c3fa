package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
)

// TestOperationRacingDeleteIsNotFound checks that an operation which found
// the sandbox before a concurrent delete removed it answers not_found, as
// one that arrives after the delete does.
func TestOperationRacingDeleteIsNotFound(t *testing.T) {
	tests := []struct {
		name string
		op   func(ctx context.Context, m *Manager, id string) error
	}{
		{"set timeout", func(ctx context.Context, m *Manager, id string) error {
			_, err := m.SetTimeout(ctx, id, time.Minute)
			return err
		}},
		{"update network", func(ctx context.Context, m *Manager, id string) error {
			_, err := m.UpdateNetwork(ctx, id, egress.Policy{})
			return err
		}},
		{"update resources", func(ctx context.Context, m *Manager, id string) error {
			_, err := m.UpdateResources(ctx, id, Limits{Pids: 50})
			return err
		}},
		{"pause", func(ctx context.Context, m *Manager, id string) error {
			_, err := m.Pause(ctx, id)
			return err
		}},
		{"resume", func(ctx context.Context, m *Manager, id string) error {
			_, err := m.Resume(ctx, id)
			return err
		}},
		{"delete", func(ctx context.Context, m *Manager, id string) error {
			return m.Delete(ctx, id)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inDelete, release := make(chan struct{}), make(chan struct{})
			h := newHarness(t, nil)
			h.restartWithFailDelete(t, func(string) error {
				close(inDelete)
				<-release
				return nil
			})
			ctx := t.Context()
			sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
			if err != nil {
				t.Fatal(err)
			}

			deleted := make(chan error, 1)
			go func() { deleted <- h.m.Delete(ctx, sb.ID) }()
			<-inDelete // the delete holds the entry and has marked it deleting
			lookedUp := make(chan struct{})
			var once sync.Once
			h.m.beforeLock = func(string) { once.Do(func() { close(lookedUp) }) }
			answered := make(chan error, 1)
			go func() { answered <- tt.op(ctx, h.m, sb.ID) }()
			<-lookedUp // the operation holds the entry the delete removes
			close(release)
			if err := <-deleted; err != nil {
				t.Fatalf("delete: %v", err)
			}
			if err := <-answered; !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("%s racing a delete answered %v, want not_found", tt.name, err)
			}
			h.assertClean(t)
		})
	}
}
