package admission

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// reservation is a reserve call running in its own goroutine.
type reservation struct {
	id   string
	done chan struct{}
	// Set once done is closed.
	started func()
	err     error
}

func reserveAsync(ctx context.Context, a *Controller, id, principal string) *reservation {
	r := &reservation{id: id, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.started, r.err = a.Reserve(ctx, id, Claim{Principal: principal})
	}()
	return r
}

// returned reports whether r's reserve returned; call after synctest.Wait.
func (r *reservation) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// mustStart fails t unless r's reserve returned with a slot.
func (r *reservation) mustStart(t *testing.T) {
	t.Helper()
	if !r.returned() {
		t.Fatalf("%s still waits, want it started", r.id)
	}
	if r.err != nil {
		t.Fatalf("%s: %v, want it started", r.id, r.err)
	}
}

// mustRefuse fails t unless r's reserve returned a 503 for reason.
func (r *reservation) mustRefuse(t *testing.T, a *Controller, reason string, refusals map[string]int) {
	t.Helper()
	if !r.returned() {
		t.Fatalf("%s still waits, want it refused", r.id)
	}
	if !errors.Is(r.err, errdefs.ErrBusy) || errdefs.RetryAfter(r.err) != time.Second {
		t.Fatalf("%s: %v (retry after %v), want busy with a retry hint of 1s", r.id, r.err, errdefs.RetryAfter(r.err))
	}
	if refusals[reason] != 1 {
		t.Fatalf("refusals %v, want one for %s", refusals, reason)
	}
	delete(refusals, reason)
	if _, ok := a.held[r.id]; ok {
		t.Fatalf("refused %s holds a claim", r.id)
	}
}

func newTestAdmitter(t *testing.T, cfg Config) (*Controller, map[string]int) {
	t.Helper()
	refusals := map[string]int{}
	// Called by reserving goroutines, read after synctest.Wait.
	a, err := New(cfg, Hooks{Refused: func(reason string) { refusals[reason]++ }})
	if err != nil {
		t.Fatal(err)
	}
	return a, refusals
}

func checkSlots(t *testing.T, a *Controller, starting, queued int) {
	t.Helper()
	_, _, _, q := a.Usage()
	if got := a.Starting(); got != starting || q != queued {
		t.Fatalf("%d starting, %d queued; want %d and %d", got, q, starting, queued)
	}
}

// Creates beyond the starting slots wait in FIFO order, each for up to
// StartWait; one that finds the start queue full, or whose caller gives
// up, is refused at once; none of them keeps a claim.
func TestStartSlotsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, refusals := newTestAdmitter(t, Config{MaxStarting: 2, StartQueueLength: 3, StartWait: time.Minute})
		ctx := t.Context()
		first, second := reserveAsync(ctx, a, "first", "p"), reserveAsync(ctx, a, "second", "p")
		synctest.Wait()
		first.mustStart(t)
		second.mustStart(t)
		third := reserveAsync(ctx, a, "third", "p")
		synctest.Wait()
		fourth := reserveAsync(ctx, a, "fourth", "p")
		synctest.Wait()
		cctx, cancel := context.WithCancel(ctx)
		fifth := reserveAsync(cctx, a, "fifth", "p")
		synctest.Wait()
		checkSlots(t, a, 2, 3)
		full := reserveAsync(ctx, a, "full", "p")
		synctest.Wait()
		full.mustRefuse(t, a, RefusedStartQueueFull, refusals)

		cancel()
		synctest.Wait()
		if !fifth.returned() || !errors.Is(fifth.err, context.Canceled) {
			t.Fatalf("fifth, whose caller gave up: returned %v, %v", fifth.returned(), fifth.err)
		}
		checkSlots(t, a, 2, 2)

		first.started()
		synctest.Wait()
		third.mustStart(t) // first in, first out
		if fourth.returned() {
			t.Fatalf("fourth overtook third: %v", fourth.err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		fourth.mustRefuse(t, a, RefusedStartWait, refusals)
		if len(refusals) != 0 {
			t.Errorf("more refusals: %v", refusals)
		}
		checkSlots(t, a, 2, 0)
		if n, _, _, _ := a.Usage(); n != 3 {
			t.Errorf("%d claims, want those of first, second and third", n)
		}
		second.started()
		third.started()
		checkSlots(t, a, 0, 0)
	})
}

// Without a start queue a create that finds every slot taken is refused
// at once, and without MaxStarting nothing waits for a slot.
func TestStartSlotsWithoutQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, refusals := newTestAdmitter(t, Config{MaxStarting: 1})
		one := reserveAsync(t.Context(), a, "one", "p")
		synctest.Wait()
		one.mustStart(t)
		two := reserveAsync(t.Context(), a, "two", "p")
		synctest.Wait()
		two.mustRefuse(t, a, RefusedStarting, refusals)

		a, _ = newTestAdmitter(t, Config{})
		for _, id := range []string{"a", "b", "c"} {
			r := reserveAsync(t.Context(), a, id, "p")
			synctest.Wait()
			r.mustStart(t)
		}
		checkSlots(t, a, 3, 0)
	})
}

// A warm pool member waiting for a slot lets every other create go first
// and does not take a place in the start queue.
func TestStartSlotsPoolYields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, refusals := newTestAdmitter(t, Config{MaxStarting: 1, StartQueueLength: 1, StartWait: time.Minute})
		ctx := t.Context()
		user := reserveAsync(ctx, a, "user", "p")
		synctest.Wait()
		user.mustStart(t)
		member := reserveAsync(ctx, a, "member", PoolPrincipal)
		synctest.Wait()
		later := reserveAsync(ctx, a, "later", "p")
		synctest.Wait()
		full := reserveAsync(ctx, a, "full", "p")
		synctest.Wait()
		full.mustRefuse(t, a, RefusedStartQueueFull, refusals)
		checkSlots(t, a, 1, 2)

		user.started()
		synctest.Wait()
		later.mustStart(t)
		if member.returned() {
			t.Fatalf("the pool member went before a user's create: %v", member.err)
		}
		later.started()
		synctest.Wait()
		member.mustStart(t)
		member.started()
		checkSlots(t, a, 0, 0)
	})
}

// A create waiting for a slot holds its share of host capacity, so that
// creates over capacity are refused at once rather than after a wait;
// one that waited for capacity then waits up to StartWait afresh for a
// slot.
func TestStartSlotsAndCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, refusals := newTestAdmitter(t, Config{MaxSandboxes: 2, QueueLength: 1, MaxWait: time.Minute,
			MaxStarting: 1, StartQueueLength: 5, StartWait: time.Minute})
		ctx := t.Context()
		running := reserveAsync(ctx, a, "running", "p")
		synctest.Wait()
		running.mustStart(t)
		slot := reserveAsync(ctx, a, "slot", "p") // holds a claim, waits for a slot
		synctest.Wait()
		capacity := reserveAsync(ctx, a, "capacity", "p") // waits for a claim
		synctest.Wait()
		over := reserveAsync(ctx, a, "over", "p")
		synctest.Wait()
		over.mustRefuse(t, a, RefusedQueueFull, refusals)
		if n, _, _, _ := a.Usage(); n != 2 {
			t.Fatalf("%d claims, want 2", n)
		}

		time.Sleep(50 * time.Second)
		running.started()
		synctest.Wait()
		slot.mustStart(t)
		a.Release("running") // its sandbox is deleted: capacity gets a claim
		synctest.Wait()
		if _, ok := a.held["capacity"]; !ok || capacity.returned() {
			t.Fatalf("capacity: claimed %v, returned %v (%v); want a claim and a wait for a slot", ok, capacity.returned(), capacity.err)
		}
		time.Sleep(50 * time.Second) // 100 s in the queue, 50 s of them for a slot
		synctest.Wait()
		if capacity.returned() {
			t.Fatalf("capacity gave up after 50 s of a wait for a slot: %v", capacity.err)
		}
		slot.started()
		synctest.Wait()
		capacity.mustStart(t)
		capacity.started()
		if len(refusals) != 0 {
			t.Errorf("more refusals: %v", refusals)
		}
	})
}

func TestStartQueueNeedsWait(t *testing.T) {
	if _, err := New(Config{MaxStarting: 1, StartQueueLength: 1}, Hooks{}); err == nil {
		t.Error("a start queue without a wait was accepted")
	}
	if _, err := New(Config{MaxStarting: -1}, Hooks{}); err == nil {
		t.Error("a negative MaxStarting was accepted")
	}
}
