package sandbox

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

func TestUpdateResources(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Max = Limits{MilliCPUs: 4000, MemoryBytes: 1 << 30, Pids: 1000}
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
