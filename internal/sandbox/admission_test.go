package sandbox

import (
	"context"
	"errors"
	"github.com/corralrun/corral/internal/admission"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
)

func TestAdmissionLimits(t *testing.T) {
	tests := []struct {
		name string
		adm  admission.Config
		// specs are created in order by principal "a" unless named "b:".
		first  []Spec
		refuse Spec
		kind   error
		reason string
		// then is created after the refusal and must succeed (another
		// principal, a smaller sandbox).
		then *Spec
	}{
		{
			name:   "max sandboxes",
			adm:    admission.Config{MaxSandboxes: 2},
			first:  []Spec{{}, {}},
			refuse: Spec{},
			kind:   errdefs.ErrBusy,
			reason: admission.RefusedSandboxes,
		},
		{
			name:   "memory commit",
			adm:    admission.Config{MemoryCommitRatio: 1.5, HostMemoryBytes: 1 << 30}, // 1.5 GiB
			first:  []Spec{{MemoryBytes: 1 << 30}},
			refuse: Spec{MemoryBytes: 768 << 20},
			kind:   errdefs.ErrBusy,
			reason: admission.RefusedMemory,
			then:   &Spec{MemoryBytes: 512 << 20},
		},
		{
			name:   "cpu commit",
			adm:    admission.Config{CPUCommitRatio: 2, HostMilliCPUs: 1000},
			first:  []Spec{{MilliCPUs: 1500}},
			refuse: Spec{MilliCPUs: 1000},
			kind:   errdefs.ErrBusy,
			reason: admission.RefusedCPU,
			then:   &Spec{MilliCPUs: 500},
		},
		{
			name:   "per principal",
			adm:    admission.Config{MaxPerPrincipal: 1},
			first:  []Spec{{}},
			refuse: Spec{},
			kind:   errdefs.ErrResourceExhausted,
			reason: admission.RefusedPrincipal,
			then:   &Spec{Metadata: map[string]string{"principal": "b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Admission = tt.adm })
			create := func(s Spec) (Sandbox, error) {
				p := "a"
				if s.Metadata["principal"] != "" {
					p = s.Metadata["principal"]
				}
				s.Template = "tiny"
				return h.m.Create(admission.WithPrincipal(t.Context(), p), s)
			}
			for _, s := range tt.first {
				if _, err := create(s); err != nil {
					t.Fatal(err)
				}
			}
			_, err := create(tt.refuse)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("create over the limit: %v, want %v", err, tt.kind)
			}
			if got := errdefs.RetryAfter(err); got != time.Second {
				t.Errorf("retry after %v, want 1s", got)
			}
			if got := h.m.Metrics().AdmissionRefusals.Value(tt.reason); got != 1 {
				t.Errorf("refusals with reason %s = %v, want 1", tt.reason, got)
			}
			if n := len(h.m.List(context.Background(), Filter{})); n != len(tt.first) {
				t.Errorf("%d sandboxes after the refusal, want %d", n, len(tt.first))
			}
			if tt.then != nil {
				if _, err := create(*tt.then); err != nil {
					t.Errorf("create within the limit: %v", err)
				}
			}
			for _, sb := range h.m.List(context.Background(), Filter{}) {
				if err := h.m.Delete(t.Context(), sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			if n, mem, cpu, q := h.m.adm.Usage(); n != 0 || mem != 0 || cpu != 0 || q != 0 {
				t.Errorf("budget after deleting everything: %d sandboxes, %d bytes, %d millicpus, %d queued", n, mem, cpu, q)
			}
			if _, err := create(tt.refuse); err != nil {
				t.Errorf("create after deleting everything: %v", err)
			}
		})
	}
}

func TestAdmissionRefusesWhatNeverFits(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MemoryCommitRatio: 1, HostMemoryBytes: 256 << 20}
	})
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", MemoryBytes: 512 << 20})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create bigger than the host: %v, want invalid argument", err)
	}
}

// A create over capacity waits in the queue and is admitted when a sandbox
// goes; one that finds the queue full is refused at once; one that waits
// too long is refused, and none of them leaves anything behind.
func TestAdmissionQueue(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MaxSandboxes: 1, QueueLength: 1, MaxWait: time.Minute}
	})
	ctx := t.Context()
	first, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := h.m.Create(ctx, Spec{Template: "tiny"})
		waited <- err
	}()
	waitFor(t, func() bool { _, _, _, q := h.m.adm.Usage(); return q == 1 })
	if _, err := h.m.Create(ctx, Spec{Template: "tiny"}); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("create with a full queue: %v, want busy", err)
	}
	if got := h.m.Metrics().AdmissionRefusals.Value(admission.RefusedQueueFull); got != 1 {
		t.Errorf("queue_full refusals = %v", got)
	}
	if err := h.m.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("queued create: %v", err)
	}

	// The queue is empty again; a create that is not admitted within
	// MaxWait, or whose caller gives up, is refused and forgotten.
	short := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MaxSandboxes: 1, QueueLength: 1, MaxWait: 20 * time.Millisecond}
	})
	held, err := short.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.m.Create(ctx, Spec{Template: "tiny"}); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("create after waiting: %v, want busy", err)
	}
	if got := short.m.Metrics().AdmissionRefusals.Value(admission.RefusedWait); got != 1 {
		t.Errorf("wait_timeout refusals = %v", got)
	}
	if err := short.m.Delete(ctx, held.ID); err != nil {
		t.Fatal(err)
	}
	short.assertClean(t)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := h.m.Create(cctx, Spec{Template: "tiny"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create whose caller gave up: %v", err)
	}
	if n, _, _, q := h.m.adm.Usage(); n != 1 || q != 0 {
		t.Errorf("budget: %d sandboxes, %d queued; want 1 and 0", n, q)
	}
	for _, sb := range h.m.List(context.Background(), Filter{}) {
		if err := h.m.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.assertClean(t)
}

// A create that fails after admission gives its claim back.
func TestAdmissionReleasedOnFailure(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission = admission.Config{MaxSandboxes: 1, MaxPerPrincipal: 1} })
	h.setFailDriver(func(string) error { return errors.New("boom") })
	for range 3 {
		if _, err := h.m.Create(t.Context(), Spec{Template: "tiny"}); err == nil || errors.Is(err, errdefs.ErrBusy) {
			t.Fatalf("create with a failing driver: %v", err)
		}
	}
	if n, _, _, _ := h.m.adm.Usage(); n != 0 {
		t.Errorf("%d claims held after failed creates", n)
	}
	h.setFailDriver(nil)
	if _, err := h.m.Create(t.Context(), Spec{Template: "tiny"}); err != nil {
		t.Fatal(err)
	}
}

// Many concurrent creates against a small capacity: each succeeds or gets
// a clean refusal, never more than the capacity exist, and the budget
// returns to zero.
func TestAdmissionConcurrent(t *testing.T) {
	const capacity, tries = 5, 40
	h := newHarness(t, func(c *Config) { c.Admission = admission.Config{MaxSandboxes: capacity} })
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, busy int
	for range tries {
		wg.Go(func() {
			_, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errdefs.ErrBusy):
				busy++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if ok != capacity || ok+busy != tries {
		t.Errorf("%d created, %d refused; want %d and %d", ok, busy, capacity, tries-capacity)
	}
	for _, sb := range h.m.List(context.Background(), Filter{}) {
		if err := h.m.Delete(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.assertClean(t)
	if n, _, _, _ := h.m.adm.Usage(); n != 0 {
		t.Errorf("%d claims held", n)
	}
}

func TestLifecycleEvents(t *testing.T) {
	h := newHarness(t, nil)
	sub := h.m.Events().Subscribe(events.Filter{})
	defer sub.Close()
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.setFailDriver(func(string) error { return errors.New("boom") })
	if _, err := h.m.Create(ctx, Spec{Template: "tiny"}); err == nil {
		t.Fatal("create with a failing driver succeeded")
	}
	var got []string
	for len(got) < 7 {
		select {
		case ev := <-sub.C():
			s := ev.Type + " " + ev.State
			if ev.Error != nil {
				s += " !"
			}
			got = append(got, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("events so far: %v", got)
		}
	}
	want := []string{"created creating", "running running", "paused paused", "resumed running", "deleted deleting", "created creating", "deleted creating !"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
	}
}

// A live limit change counts against host capacity like a create.
func TestAdmissionResize(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MemoryCommitRatio: 1, HostMemoryBytes: 1 << 30, CPUCommitRatio: 1, HostMilliCPUs: 2000}
	})
	ctx := t.Context()
	a, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 512 << 20, MilliCPUs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 256 << 20, MilliCPUs: 500}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		l    Limits
		kind error
		mem  int64 // committed afterwards
	}{
		{"memory over", Limits{MemoryBytes: 800 << 20}, errdefs.ErrBusy, 768 << 20},
		{"cpu over", Limits{MilliCPUs: 1600}, errdefs.ErrBusy, 768 << 20},
		{"grow within", Limits{MemoryBytes: 768 << 20}, nil, 1 << 30},
		{"shrink", Limits{MemoryBytes: 128 << 20}, nil, 384 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.m.UpdateResources(ctx, a.ID, tt.l)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("UpdateResources: %v, want %v", err, tt.kind)
			}
			if _, mem, _, _ := h.m.adm.Usage(); mem != tt.mem {
				t.Errorf("committed memory %d MiB, want %d MiB", mem>>20, tt.mem>>20)
			}
		})
	}
}

// Sandboxes found at start count against their owner's limit and the
// host's capacity as before the restart.
func TestAdmissionSurvivesRestart(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission = admission.Config{MaxPerPrincipal: 1, MaxSandboxes: 2} })
	ctx := admission.WithPrincipal(t.Context(), "a")
	if _, err := h.m.Create(ctx, Spec{Template: "tiny"}); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.start(t)
	if _, err := h.m.Create(ctx, Spec{Template: "tiny"}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("second create of the same owner after a restart: %v, want resource exhausted", err)
	}
	if _, err := h.m.Create(admission.WithPrincipal(t.Context(), "b"), Spec{Template: "tiny"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(admission.WithPrincipal(t.Context(), "c"), Spec{Template: "tiny"}); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("third sandbox after a restart: %v, want busy", err)
	}
}
