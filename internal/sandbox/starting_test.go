package sandbox

import (
	"context"
	"errors"
	"github.com/corralrun/corral/internal/admission"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Concurrent creates run at most MaxStarting at once through storage and
// the driver; the others wait for a slot and then succeed.
func TestCreatesWithinStartingSlots(t *testing.T) {
	const slots, creates = 2, 6
	h := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MaxStarting: slots, StartQueueLength: creates, StartWait: time.Hour}
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
		_, _, _, q := h.m.adm.Usage()
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
	if n := h.m.adm.Starting(); n != 0 {
		t.Errorf("%d slots still taken", n)
	}
	for _, sb := range h.m.List(context.Background(), Filter{}) {
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
		c.Admission = admission.Config{MaxStarting: 1}
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
	waitFor(t, func() bool { return h.m.adm.Starting() == 1 })
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
