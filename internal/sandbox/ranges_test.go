package sandbox

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// allRanges is every range of the table, for the checks that hold for all.
var allRanges = []Range{RangeCPUs, RangeMemory, RangePids, RangeDisk, RangeTimeout, RangeIdleTimeout,
	RangeExecTimeout, RangeExecOutput, RangePoolSize, RangeForkCount, RangePTYCols, RangePTYRows, RangeFileMode, RangePort}

// TestRangeTable: every bound converts exactly between the API's unit and
// the Manager's, and the largest value converts without overflow.
func TestRangeTable(t *testing.T) {
	for _, r := range allRanges {
		t.Run(r.Field, func(t *testing.T) {
			if r.Min < 0 || r.Min > r.Max || r.Scale < 1 || r.Field == "" || r.Unit == "" {
				t.Fatalf("malformed range %+v", r)
			}
			if r.Max > math.MaxInt64/r.Scale*r.Scale {
				t.Errorf("Max %d overflows", r.Max)
			}
			if r.Field == "cpus" {
				return // fractional: ConvertFloat
			}
			if r.Min%r.Scale != 0 || r.Max%r.Scale != 0 {
				t.Errorf("bounds %d..%d are not whole multiples of %d", r.Min, r.Max, r.Scale)
			}
			for _, v := range []int64{r.Min / r.Scale, r.Max / r.Scale} {
				if n, err := r.Convert(v); err != nil || n != v*r.Scale || r.Check(n) != nil {
					t.Errorf("Convert(%d) = %d, %v", v, n, err)
				}
			}
		})
	}
}

func TestRangeConvert(t *testing.T) {
	tests := []struct {
		name string
		r    Range
		v    int64
		want int64 // -1: refused
	}{
		{"memory minimum", RangeMemory, 16, 16 << 20},
		{"memory below", RangeMemory, 15, -1},
		{"memory that would wrap to 0", RangeMemory, 1 << 44, -1},
		{"memory that would wrap to 512 MiB", RangeMemory, 1<<44 + 512, -1},
		{"memory negative", RangeMemory, -1, -1},
		{"pids maximum", RangePids, 4194304, 4194304},
		{"pids above", RangePids, 100000000, -1},
		{"pids max int64", RangePids, math.MaxInt64, -1},
		{"timeout 0", RangeTimeout, 0, 0},
		{"timeout ten years", RangeTimeout, 315360000, int64(MaxTimeout)},
		{"timeout that would overflow a Duration", RangeTimeout, math.MaxInt64, -1},
		{"timeout negative", RangeTimeout, -1, -1},
		{"exec timeout above", RangeExecTimeout, int64(MaxTimeout/time.Millisecond) + 1, -1},
		{"fork 0", RangeForkCount, 0, -1},
		{"mode 07777", RangeFileMode, 0o7777, 0o7777},
		{"mode 010000", RangeFileMode, 0o10000, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.r.Convert(tt.v)
			checkConverted(t, tt.r, got, err, tt.want)
		})
	}
}

func TestRangeConvertFloat(t *testing.T) {
	tests := []struct {
		name string
		v    float64
		want int64 // -1: refused
	}{
		{"minimum", 0.01, 10},
		{"one", 1, 1000},
		{"rounds to the minimum", 0.0095, 10},
		{"rounds below the minimum", 0.004, -1},
		{"tiny", 1e-9, -1},
		{"maximum", 1024, 1024000},
		{"above", 1024.5, -1},
		{"huge", 1e9, -1},
		{"past int64", 1e300, -1},
		{"negative", -1, -1},
		{"NaN", math.NaN(), -1},
		{"infinity", math.Inf(1), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RangeCPUs.ConvertFloat(tt.v)
			checkConverted(t, RangeCPUs, got, err, tt.want)
		})
	}
}

func checkConverted(t *testing.T, r Range, got int64, err error, want int64) {
	t.Helper()
	if want >= 0 {
		if err != nil || got != want {
			t.Errorf("= %d, %v; want %d", got, err, want)
		}
		return
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("= %d, %v; want ErrInvalidArgument", got, err)
	}
	// The message names the field and its range in the API's unit.
	for _, s := range []string{r.Field, fmtBound(r.APIMin()), fmtBound(r.APIMax()), r.Unit} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

// TestManagerRefusesOutOfRange: the Manager checks the ranges itself, for
// callers other than the API, at create and for execs.
func TestManagerRefusesOutOfRange(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	tests := []struct {
		name string
		spec Spec
	}{
		{"cpus", Spec{MilliCPUs: 5}},
		{"memory", Spec{MemoryBytes: math.MaxInt64}},
		{"pids", Spec{Pids: 100000000}},
		{"disk", Spec{DiskBytes: 1 << 60}},
		{"negative disk", Spec{DiskBytes: -1}},
		{"timeout", Spec{Timeout: ptr(time.Duration(math.MaxInt64))}},
		{"negative timeout", Spec{Timeout: ptr(-time.Second)}},
		{"idle timeout", Spec{IdleTimeout: MaxTimeout + time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Template = "tiny"
			if _, err := h.m.Create(ctx, tt.spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Create = %v, want ErrInvalidArgument", err)
			}
		})
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Fork(ctx, sb.ID, MaxForks+1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Fork of %d = %v, want ErrInvalidArgument", MaxForks+1, err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// A server default or maximum out of range is refused by New rather than
// by every create.
func TestNewRefusesOutOfRangeConfig(t *testing.T) {
	h := newHarness(t, nil)
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"default pids", func(c *Config) { c.Defaults.Pids = driver.MaxPids + 1 }},
		{"maximum memory", func(c *Config) { c.Max.MemoryBytes = 1 << 20 }},
		{"maximum timeout", func(c *Config) { c.MaxTimeout = time.Duration(math.MaxInt64) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := h.cfg
			tt.mod(&cfg)
			if m, err := New(cfg); err == nil {
				m.Close()
				t.Fatal("New accepted the configuration")
			}
		})
	}
}
