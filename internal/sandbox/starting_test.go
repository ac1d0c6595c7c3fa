package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
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

func reserveAsync(ctx context.Context, a *admitter, id, principal string) *reservation {
	r := &reservation{id: id, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.started, r.err = a.reserve(ctx, id, claim{principal: principal})
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
func (r *reservation) mustRefuse(t *testing.T, a *admitter, reason string, refusals map[string]int) {
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

func newTestAdmitter(t *testing.T, cfg Admission) (*admitter, map[string]int) {
	t.Helper()
	a, err := newAdmitter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	refusals := map[string]int{}
	a.onRefuse = func(reason string) { refusals[reason]++ } // called by reserving goroutines, read after synctest.Wait
	return a, refusals
}

func checkSlots(t *testing.T, a *admitter, starting, queued int) {
	t.Helper()
	_, _, _, q := a.usage()
	if got := a.startingNow(); got != starting || q != queued {
		t.Fatalf("%d starting, %d queued; want %d and %d", got, q, starting, queued)
	}
}

// Creates beyond the starting slots wait in FIFO order, each for up to
// StartWait; one that finds the start queue full, or whose caller gives
// up, is refused at once; none of them keeps a claim.
func TestStartSlotsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, refusals := newTestAdmitter(t, Admission{MaxStarting: 2, StartQueueLength: 3, StartWait: time.Minute})
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
		if n, _, _, _ := a.usage(); n != 3 {
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
		a, refusals := newTestAdmitter(t, Admission{MaxStarting: 1})
		one := reserveAsync(t.Context(), a, "one", "p")
		synctest.Wait()
		one.mustStart(t)
		two := reserveAsync(t.Context(), a, "two", "p")
		synctest.Wait()
		two.mustRefuse(t, a, RefusedStarting, refusals)

		a, _ = newTestAdmitter(t, Admission{})
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
		a, refusals := newTestAdmitter(t, Admission{MaxStarting: 1, StartQueueLength: 1, StartWait: time.Minute})
		ctx := t.Context()
		user := reserveAsync(ctx, a, "user", "p")
		synctest.Wait()
		user.mustStart(t)
		member := reserveAsync(ctx, a, "member", poolPrincipal)
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
		a, refusals := newTestAdmitter(t, Admission{MaxSandboxes: 2, QueueLength: 1, MaxWait: time.Minute,
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
		if n, _, _, _ := a.usage(); n != 2 {
			t.Fatalf("%d claims, want 2", n)
		}

		time.Sleep(50 * time.Second)
		running.started()
		synctest.Wait()
		slot.mustStart(t)
		a.release("running") // its sandbox is deleted: capacity gets a claim
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
	if _, err := newAdmitter(Admission{MaxStarting: 1, StartQueueLength: 1}); err == nil {
		t.Error("a start queue without a wait was accepted")
	}
	if _, err := newAdmitter(Admission{MaxStarting: -1}); err == nil {
		t.Error("a negative MaxStarting was accepted")
	}
}

// Concurrent creates run at most MaxStarting at once through storage and
// the driver; the others wait for a slot and then succeed.
func TestCreatesWithinStartingSlots(t *testing.T) {
	const slots, creates = 2, 6
	h := newHarness(t, func(c *Config) {
		c.Admission = Admission{MaxStarting: slots, StartQueueLength: creates, StartWait: time.Hour}
	})
	var mu sync.Mutex
	inDriver, most := 0, 0
	gate := make(chan struct{})
	h.setFailDriver(func(string) error {
		mu.Lock()
		inDriver++
		most = max(most, inDriver)
		mu.Unlock()
		<-gate
		mu.Lock()
		inDriver--
		mu.Unlock()
		return nil
	})
	errs := make(chan error, creates)
	for range creates {
		go func() {
			_, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
			errs <- err
		}()
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, _, _, q := h.m.adm.usage()
		return inDriver == slots && q == creates-slots
	})
	close(gate)
	for range creates {
		if err := <-errs; err != nil {
			t.Errorf("create: %v", err)
		}
	}
	if most != slots {
		t.Errorf("%d creates in the driver at once, want %d", most, slots)
	}
	if n := h.m.adm.startingNow(); n != 0 {
		t.Errorf("%d slots still taken", n)
	}
	for _, sb := range h.m.List(Filter{}) {
		if err := h.m.Delete(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.assertClean(t)
}

// logRecords is a slog.Handler that keeps what is logged.
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// mentioning returns the records whose message or attributes contain s,
// each as its level, message and attributes.
func (l *logRecords) mentioning(s string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.records {
		m := map[string]string{"level": r.Level.String(), "msg": r.Message}
		text := r.Message
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			text += " " + a.Value.String()
			return true
		})
		if strings.Contains(text, s) {
			out = append(out, m)
		}
	}
	return out
}

// A create that fails is logged once, with its sandbox, runtime,
// template, duration and cause: a failure as an error, a refusal as a
// warning; a warm pool member's failed create names its pool.
func TestFailedCreatesLoggedOnce(t *testing.T) {
	logs := &logRecords{}
	h := newHarness(t, func(c *Config) {
		c.Logger = slog.New(logs)
		c.Admission = Admission{MaxStarting: 1}
	})
	h.setFailDriver(func(string) error { return errors.New("boom") })
	if _, err := h.m.Create(t.Context(), Spec{Template: "tiny"}); err == nil {
		t.Fatal("create with a failing driver succeeded")
	}
	// A create that holds the only slot makes the next one a refusal.
	gate := make(chan struct{})
	h.setFailDriver(func(string) error { <-gate; return nil })
	held := make(chan error, 1)
	go func() {
		_, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
		held <- err
	}()
	waitFor(t, func() bool { return h.m.adm.startingNow() == 1 })
	_, refusal := h.m.Create(t.Context(), Spec{Template: "tiny"})
	if !errors.Is(refusal, errdefs.ErrBusy) {
		t.Fatalf("create with every slot taken: %v, want busy", refusal)
	}
	close(gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}

	check := func(mentioning, level, msg string) map[string]string {
		t.Helper()
		got := logs.mentioning(mentioning)
		if len(got) != 1 {
			t.Fatalf("%d log records mention %q, want 1: %v", len(got), mentioning, got)
		}
		r := got[0]
		if r["level"] != level || r["msg"] != msg || r["sandbox_id"] == "" || r["runtime"] != "fake" ||
			r["template"] != "tiny" || r["duration_ms"] == "" {
			t.Errorf("log record %v, want %s %q with sandbox_id, runtime, template and duration_ms", r, level, msg)
		}
		return r
	}
	check("boom", "ERROR", "sandbox create failed")
	check(refusal.Error(), "WARN", "sandbox create refused")

	h.setFailDriver(func(string) error { return errors.New("pool boom") })
	if _, err := h.m.SetPool(t.Context(), Pool{Name: "p", Template: "tiny", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", func(st PoolStatus) bool { return st.Error != "" })
	if err := h.m.RemovePool(t.Context(), "p"); err != nil {
		t.Fatal(err)
	}
	// The pool may have tried again meanwhile: one record per member.
	seen := map[string]bool{}
	for _, r := range logs.mentioning("pool boom") {
		if r["level"] != "ERROR" || r["msg"] != "sandbox create failed" || r["pool"] != "p" || r["sandbox_id"] == "" {
			t.Errorf("pool member's failed create logged as %v, want an error naming its pool and sandbox", r)
		}
		if seen[r["sandbox_id"]] {
			t.Errorf("pool member %s's failed create logged twice", r["sandbox_id"])
		}
		seen[r["sandbox_id"]] = true
	}
	if len(seen) == 0 {
		t.Error("no log record of the pool member's failed create")
	}
}
