package sandbox

import (
	"context"
	"errors"
	"github.com/corralrun/corral/internal/admission"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

func TestUpdateResources(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Max = Limits{MilliCPUs: 4000, MemoryBytes: 1 << 30}
	})
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      Limits
		wantErr error
		want    driver.Resources
	}{
		{name: "cpu and memory", in: Limits{MilliCPUs: 2000, MemoryBytes: 512 << 20},
			want: driver.Resources{MilliCPUs: 2000, MemoryBytes: 512 << 20, Pids: 100}},
		{name: "pids only keeps the rest", in: Limits{Pids: 300},
			want: driver.Resources{MilliCPUs: 2000, MemoryBytes: 512 << 20, Pids: 300}},
		{name: "above the maximum", in: Limits{MemoryBytes: 2 << 30}, wantErr: errdefs.ErrInvalidArgument},
		{name: "negative", in: Limits{MilliCPUs: -1}, wantErr: errdefs.ErrInvalidArgument},
		{name: "below the memory minimum", in: Limits{MemoryBytes: 1 << 20}, wantErr: errdefs.ErrInvalidArgument},
		{name: "cpus below the quota minimum", in: Limits{MilliCPUs: 5}, wantErr: errdefs.ErrInvalidArgument},
		{name: "pids above what the kernel takes", in: Limits{Pids: driver.MaxPids + 1}, wantErr: errdefs.ErrInvalidArgument},
		{name: "disk", in: Limits{DiskBytes: 1 << 30}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := h.drv.Resources(sb.ID)
			got, err := h.m.UpdateResources(ctx, sb.ID, tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("UpdateResources = %v, want %v", err, tt.wantErr)
				}
				if after, _ := h.drv.Resources(sb.ID); after != before {
					t.Errorf("a refused update changed the driver's limits: %+v -> %+v", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r, err := h.drv.Resources(sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, r); diff != "" {
				t.Errorf("driver limits (-want +got):\n%s", diff)
			}
			if got.MilliCPUs != tt.want.MilliCPUs || got.MemoryBytes != tt.want.MemoryBytes || got.Pids != tt.want.Pids {
				t.Errorf("returned %+v, want %+v", got, tt.want)
			}
			rec := h.store.sandbox(sb.ID)
			if rec.MilliCPUs != tt.want.MilliCPUs || rec.MemoryBytes != tt.want.MemoryBytes || rec.Pids != tt.want.Pids {
				t.Errorf("stored %+v, want %+v", rec, tt.want)
			}
		})
	}
	if _, err := h.m.UpdateResources(ctx, "nope", Limits{Pids: 5}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestUpdateAllOrNothing: an update that fails anywhere (a value out of
// range next to valid ones, the runtime refusing the limits, the record
// not written) leaves the sandbox's record, its stored record, the
// runtime's limits and its admission claim as they were.
func TestUpdateAllOrNothing(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Admission = admission.Config{MemoryCommitRatio: 1, HostMemoryBytes: 4 << 30}
	})
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 512 << 20, MilliCPUs: 1000, Pids: 100})
	if err != nil {
		t.Fatal(err)
	}
	grow := Limits{MemoryBytes: 1 << 30, MilliCPUs: 2000, Pids: 200}
	refused := errors.New("the host refuses")
	tests := []struct {
		name string
		u    Update
		fail func() // injects a failure; undone after the case
		kind error  // nil: any error
	}{
		{name: "runtime refuses", u: Update{Limits: grow},
			fail: func() { h.setFailUpdate(func(string) error { return refused }) }},
		{name: "record not written", u: Update{Limits: grow, Lifecycle: Lifecycle{IdleTimeout: ptr(time.Minute)}},
			fail: func() {
				h.store.mu.Lock()
				h.store.failPut = func(Sandbox) error { return refused }
				h.store.mu.Unlock()
			}},
		{name: "unknown action after valid limits", u: Update{Limits: grow, Lifecycle: Lifecycle{OnIdle: "later"}},
			kind: errdefs.ErrInvalidArgument},
		{name: "pids out of range after valid memory", u: Update{Limits: Limits{MemoryBytes: 1 << 30, Pids: math.MaxInt64}},
			kind: errdefs.ErrInvalidArgument},
		{name: "idle timeout out of range after valid limits", u: Update{Limits: grow, Lifecycle: Lifecycle{IdleTimeout: ptr(time.Duration(math.MaxInt64))}},
			kind: errdefs.ErrInvalidArgument},
		{name: "memory past the range", u: Update{Limits: Limits{MemoryBytes: math.MaxInt64}}, kind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := h.m.Get(context.Background(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			limits, _ := h.drv.Resources(sb.ID)
			_, mem, _, _ := h.m.adm.Usage()
			if tt.fail != nil {
				tt.fail()
			}
			_, err = h.m.Update(ctx, sb.ID, tt.u)
			h.setFailUpdate(nil)
			h.store.mu.Lock()
			h.store.failPut = nil
			h.store.mu.Unlock()
			if err == nil || (tt.kind != nil && !errors.Is(err, tt.kind)) {
				t.Fatalf("Update = %v, want an error of kind %v", err, tt.kind)
			}
			after, _ := h.m.Get(context.Background(), sb.ID)
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("record after a failed update (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(before, h.store.sandbox(sb.ID)); diff != "" {
				t.Errorf("stored record after a failed update (-before +after):\n%s", diff)
			}
			if got, _ := h.drv.Resources(sb.ID); got != limits {
				t.Errorf("runtime's limits after a failed update: %+v, want %+v", got, limits)
			}
			if _, got, _, _ := h.m.adm.Usage(); got != mem {
				t.Errorf("committed memory after a failed update: %d MiB, want %d MiB", got>>20, mem>>20)
			}
		})
	}
	// The same update without the failure goes through.
	got, err := h.m.Update(ctx, sb.ID, Update{Limits: grow, Lifecycle: Lifecycle{IdleTimeout: ptr(time.Minute)}})
	if err != nil || got.MemoryBytes != grow.MemoryBytes || got.IdleTimeout != time.Minute {
		t.Fatalf("Update = %+v, %v", got, err)
	}
	if r, _ := h.drv.Resources(sb.ID); r != (driver.Resources{MilliCPUs: 2000, MemoryBytes: 1 << 30, Pids: 200}) {
		t.Errorf("runtime's limits after the update: %+v", r)
	}
}
