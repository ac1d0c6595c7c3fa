package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// fakePauser records the sandboxes the Manager's timers paused.
type fakePauser struct {
	mu     sync.Mutex
	h      *harness
	paused []string
}

func (p *fakePauser) pause(ctx context.Context, id string) (Sandbox, error) {
	p.mu.Lock()
	p.paused = append(p.paused, id)
	p.mu.Unlock()
	e, err := p.h.m.entry(context.Background(), id)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.h.drv.Pause(ctx, id); err != nil {
		return Sandbox{}, err
	}
	p.h.m.mu.Lock()
	e.sb.State = StatePaused
	sb := e.sb.clone()
	p.h.m.mu.Unlock()
	return sb, nil
}

func (p *fakePauser) calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paused...)
}

func TestIdleTimeoutDestroys(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", IdleTimeout: time.Minute, Timeout: ptr(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if sb.IdleTimeout != time.Minute || sb.OnIdle != ActionDestroy || sb.OnDeadline != ActionDestroy {
		t.Fatalf("created %+v", sb)
	}
	h.m.reapExpired() // starts the idle clock
	h.now.Add(50 * time.Second)
	h.m.reapExpired()
	execStdout(t, h, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}) // activity
	h.now.Add(50 * time.Second)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); err != nil {
		t.Fatalf("reaped 50s after an exec: %v", err)
	}
	// File activity resets the idle clock too; reading the record does not.
	if _, err := h.m.Agent(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	h.now.Add(50 * time.Second)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); err != nil {
		t.Fatalf("reaped 50s after file activity: %v", err)
	}
	// An attach session holds the sandbox active however long it lasts.
	release := h.m.Active(sb.ID)
	h.now.Add(10 * time.Minute)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); err != nil {
		t.Fatalf("reaped during an attach session: %v", err)
	}
	release()
	h.now.Add(30 * time.Second)
	h.m.Get(context.Background(), sb.ID)
	h.m.List(context.Background(), Filter{})
	h.now.Add(31 * time.Second)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("idle sandbox not destroyed: %v", err)
	}
	h.assertClean(t)
}

func TestLifecycleActions(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	// The fake runtime can pause, so the pause action is accepted.
	for _, spec := range []Spec{
		{Template: "tiny", OnIdle: ActionPause},
		{Template: "tiny", OnDeadline: ActionPause},
	} {
		sb, err := h.m.Create(ctx, spec)
		if err != nil {
			t.Fatalf("pause action on a runtime that pauses: %v", err)
		}
		if err := h.m.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name string
		spec Spec
	}{
		{"unknown action", Spec{Template: "tiny", OnIdle: "explode"}},
		{"negative idle", Spec{Template: "tiny", IdleTimeout: -time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := h.m.Create(ctx, tt.spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("got %v", err)
			}
		})
	}

	p := &fakePauser{h: h}
	h.m.life.pause = p.pause
	idle, err := h.m.Create(ctx, Spec{Template: "tiny", IdleTimeout: time.Minute, OnIdle: ActionPause, Timeout: ptr(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	late, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(2 * time.Minute), OnDeadline: ActionPause})
	if err != nil {
		t.Fatal(err)
	}
	h.m.reapExpired()
	h.now.Add(61 * time.Second)
	h.m.reapExpired()
	if got, _ := h.m.Get(context.Background(), idle.ID); got.State != StatePaused || got.Deadline.IsZero() {
		t.Fatalf("idle sandbox after its idle timeout: %+v", got)
	}
	h.now.Add(time.Minute)
	h.m.reapExpired()
	got, _ := h.m.Get(context.Background(), late.ID)
	if got.State != StatePaused || !got.Deadline.IsZero() {
		t.Fatalf("sandbox after its deadline with action pause: %+v", got)
	}
	if rec := h.store.sandbox(late.ID); !rec.Deadline.IsZero() {
		t.Fatalf("store keeps the deadline of the paused sandbox: %s", rec.Deadline)
	}
	h.now.Add(time.Hour)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), late.ID); err != nil {
		t.Fatalf("paused sandbox reaped later: %v", err)
	}
	if _, err := h.m.Get(context.Background(), idle.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("idle-paused sandbox outlived its deadline (destroy): %v", err)
	}
	if calls := p.calls(); len(calls) != 2 {
		t.Fatalf("pause calls %v", calls)
	}

	// SetLifecycle changes timers and nothing else.
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	upd, err := h.m.SetLifecycle(ctx, sb.ID, Lifecycle{IdleTimeout: ptr(30 * time.Second), OnIdle: ActionPause})
	if err != nil {
		t.Fatal(err)
	}
	if upd.IdleTimeout != 30*time.Second || upd.OnIdle != ActionPause || upd.OnDeadline != ActionDestroy || !upd.Deadline.Equal(sb.Deadline) {
		t.Fatalf("after SetLifecycle: %+v", upd)
	}
	if rec := h.store.sandbox(sb.ID); rec.IdleTimeout != 30*time.Second || rec.OnIdle != ActionPause {
		t.Fatalf("store after SetLifecycle: %+v", rec)
	}
	upd, err = h.m.SetLifecycle(ctx, sb.ID, Lifecycle{IdleTimeout: ptr(time.Duration(0))})
	if err != nil || upd.IdleTimeout != 0 || upd.OnIdle != ActionPause {
		t.Fatalf("turning the idle timeout off: %v %+v", err, upd)
	}
	if _, err := h.m.SetLifecycle(ctx, sb.ID, Lifecycle{OnDeadline: "later"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad action: %v", err)
	}
	if _, err := h.m.SetLifecycle(ctx, "missing", Lifecycle{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	for _, id := range []string{late.ID, sb.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	h.assertClean(t)
}

// A long exec is activity for as long as it runs.
func TestIdleTimeoutWaitsForExec(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", IdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	h.m.reapExpired()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		done <- h.m.Exec(ctx, sb.ID, wire.ExecRequest{Shell: "echo go; sleep 1"}, func(ev wire.ExecEvent) error {
			if ev.Type == wire.EventStdout {
				once.Do(func() { close(started) })
			}
			return nil
		})
	}()
	<-started
	h.now.Add(5 * time.Minute)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); err != nil {
		t.Fatalf("reaped during an exec: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.now.Add(2 * time.Minute)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("not reaped after the exec: %v", err)
	}
	h.assertClean(t)
}
