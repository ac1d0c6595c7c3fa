package sandbox

import (
	"math"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// Range is the documented range of one numeric field of the API, the same
// for every request that has the field: Min and Max in the Manager's unit,
// and Scale, the Manager's units in one of the API's (1<<20 bytes for a
// field in MiB). The API states the range as Min/Scale to Max/Scale of
// Unit, and openapi.json as the field's minimum and maximum.
//
// Both sides check: the API before it converts a value, so that a value
// out of range is refused instead of overflowing (memory_mb<<20, cpus*1000,
// seconds to a time.Duration), and the Manager, for the callers that are
// not the API. Where the API reads 0 as "omitted" (the default, or no
// change), 0 is not checked.
type Range struct {
	Field    string
	Unit     string
	Min, Max int64
	Scale    int64
}

// MaxTimeout bounds every timeout a request may ask for, far beyond any
// server maximum an operator sets, and far below what a time.Duration holds.
const MaxTimeout = 10 * 365 * 24 * time.Hour

// The ranges of the API's numeric fields. The kernel sets some bounds: a
// CFS quota (cpus) is at least 1 ms per 100 ms period, and pids.max takes
// at most driver.MaxPids. The others are beyond any host this runs on, and
// keep the conversions exact.
var (
	RangeCPUs        = Range{Field: "cpus", Unit: "CPUs", Min: 10, Max: 1024 * 1000, Scale: 1000}
	RangeMemory      = Range{Field: "memory_mb", Unit: "MiB", Min: 16 << 20, Max: 16 << 40, Scale: 1 << 20}
	RangePids        = Range{Field: "pids", Unit: "processes", Min: 1, Max: driver.MaxPids, Scale: 1}
	RangeDisk        = Range{Field: "disk_mb", Unit: "MiB", Min: 1 << 20, Max: 1 << 50, Scale: 1 << 20}
	RangeTimeout     = Range{Field: "timeout", Unit: "seconds", Min: 0, Max: int64(MaxTimeout), Scale: int64(time.Second)}
	RangeIdleTimeout = Range{Field: "idle_timeout", Unit: "seconds", Min: 0, Max: int64(MaxTimeout), Scale: int64(time.Second)}
	RangeExecTimeout = Range{Field: "timeout_ms", Unit: "milliseconds", Min: 0, Max: int64(MaxTimeout / time.Millisecond), Scale: 1}
	RangeExecOutput  = Range{Field: "max_output_bytes", Unit: "bytes", Min: 0, Max: 1 << 40, Scale: 1}
	// RangeCodeOutput bounds what one code execution may ask to receive
	// of its stdout and stderr.
	RangeCodeOutput = Range{Field: "max_output_bytes", Unit: "bytes", Min: 0, Max: 64 << 20, Scale: 1}
	RangePoolSize   = Range{Field: "size", Unit: "sandboxes", Min: 0, Max: MaxPoolSize, Scale: 1}
	RangeForkCount  = Range{Field: "count", Unit: "copies", Min: 1, Max: MaxForks, Scale: 1}
	RangeVolumeSize = Range{Field: "size_bytes", Unit: "bytes", Min: 0, Max: 1 << 50, Scale: 1}
	RangePTYCols    = Range{Field: "cols", Unit: "columns", Min: 1, Max: math.MaxUint16, Scale: 1}
	RangePTYRows    = Range{Field: "rows", Unit: "rows", Min: 1, Max: math.MaxUint16, Scale: 1}
	RangeFileMode   = Range{Field: "mode", Unit: "permission bits", Min: 0, Max: 0o7777, Scale: 1}
	RangePort       = Range{Field: "port", Unit: "TCP port", Min: 1, Max: math.MaxUint16, Scale: 1}
)

// The ranges of a tenant's quotas (an API key's): 0 is no quota.
var (
	RangeQuotaSandboxes = Range{Field: "max_sandboxes", Unit: "sandboxes", Min: 0, Max: 1 << 20, Scale: 1}
	RangeQuotaMemory    = Range{Field: "max_memory_mb", Unit: "MiB", Min: 0, Max: 1 << 50, Scale: 1 << 20}
	RangeQuotaCPUs      = Range{Field: "max_cpus", Unit: "CPUs", Min: 0, Max: 1 << 30, Scale: 1000}
	RangeQuotaDisk      = Range{Field: "max_disk_mb", Unit: "MiB", Min: 0, Max: 1 << 50, Scale: 1 << 20}
	RangeCreateRate     = Range{Field: "creates_per_minute", Unit: "creates", Min: 0, Max: 1 << 20, Scale: 1}
)

// APIMin and APIMax are the bounds in the API's unit.
func (r Range) APIMin() float64 { return float64(r.Min) / float64(r.Scale) }

// APIMax: see APIMin.
func (r Range) APIMax() float64 { return float64(r.Max) / float64(r.Scale) }

// Convert checks v, a value of the field in the API's unit, and returns it
// in the Manager's unit. The error wraps errdefs.ErrInvalidArgument and
// names the field and its range.
func (r Range) Convert(v int64) (int64, error) {
	if v < r.Min/r.Scale || v > r.Max/r.Scale || v*r.Scale < r.Min {
		return 0, r.refuse(strconv.FormatInt(v, 10))
	}
	return v * r.Scale, nil
}

// ConvertFloat is Convert for a field with a fractional value (cpus),
// rounded to the Manager's unit: a value that rounds to less than Min,
// such as 1e-9 CPUs, is refused like any other out of range.
func (r Range) ConvertFloat(v float64) (int64, error) {
	n := math.Round(v * float64(r.Scale))
	// Written so that NaN fails too.
	if !(n >= float64(r.Min) && n <= float64(r.Max)) {
		return 0, r.refuse(strconv.FormatFloat(v, 'g', -1, 64))
	}
	return int64(n), nil
}

// Check checks v, a value in the Manager's unit.
func (r Range) Check(v int64) error {
	if v < r.Min || v > r.Max {
		return r.refuse(strconv.FormatFloat(float64(v)/float64(r.Scale), 'g', -1, 64))
	}
	return nil
}

// CheckDuration is Check for a field the Manager holds as a time.Duration.
func (r Range) CheckDuration(d time.Duration) error { return r.Check(int64(d)) }

func (r Range) refuse(got string) error {
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s must be from %s to %s (%s), not %s",
		r.Field, fmtBound(r.APIMin()), fmtBound(r.APIMax()), r.Unit, got)
}

func fmtBound(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
