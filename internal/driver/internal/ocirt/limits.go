package ocirt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/driver"
)

// CFSPeriod is the CFS period of every sandbox's CPU limit, in
// microseconds; quotas are relative to it.
const CFSPeriod = 100000

// Limits are the values of a cgroup's limit files; a zero field is no
// limit.
type Limits struct {
	MemoryBytes int64
	// CPUQuota is in microseconds of CPU time per CFSPeriod.
	CPUQuota int64
	// Pids above driver.MaxPids are set as driver.MaxPids, which no host
	// can exceed.
	Pids int64
}

// LimitsOf returns the cgroup limits that enforce r.
func LimitsOf(r driver.Resources) Limits {
	return Limits{MemoryBytes: r.MemoryBytes, CPUQuota: r.MilliCPUs * CFSPeriod / 1000, Pids: r.Pids}
}

// SetLimits writes l into the cgroup's limit files, one after the other:
// memory (and no swap: on v1 with swapAccounting the same memory+swap
// limit, on v2 a swap limit of 0), CPU, then pids. When the kernel refuses
// one value, the files written before it get back the values they held,
// so that the cgroup has either all of l or the limits it had; the error
// says so when one of those could not be put back. After a success, undo
// puts the earlier limits back, for a caller whose next step fails.
func (c Cgroup) SetLimits(l Limits, swapAccounting bool) (undo func() error, err error) {
	writes, err := c.limitWrites(l, swapAccounting)
	if err != nil {
		return nil, fmt.Errorf("setting limits of cgroup %s: %w", c.Path, err)
	}
	undo, err = writeAll(writes)
	if err != nil {
		return nil, fmt.Errorf("setting limits of cgroup %s: %w", c.Path, err)
	}
	return undo, nil
}

// cgroupWrite is one value for one cgroup file.
type cgroupWrite struct{ file, value string }

// limitWrites returns the writes that set l, in order.
func (c Cgroup) limitWrites(l Limits, swapAccounting bool) ([]cgroupWrite, error) {
	max := func(v int64, unlimited string) string {
		if v > 0 {
			return strconv.FormatInt(v, 10)
		}
		return unlimited
	}
	pids := max(min(l.Pids, driver.MaxPids), "max")
	if c.V2 {
		dir := c.Dir("")
		writes := []cgroupWrite{{filepath.Join(dir, "memory.max"), max(l.MemoryBytes, "max")}}
		// Without swap accounting there is no swap limit to set, and no
		// swap charged to the cgroup.
		if swap := filepath.Join(dir, "memory.swap.max"); fileExists(swap) {
			writes = append(writes, cgroupWrite{swap, "0"})
		}
		return append(writes,
			cgroupWrite{filepath.Join(dir, "cpu.max"), max(l.CPUQuota, "max") + " " + strconv.Itoa(CFSPeriod)},
			cgroupWrite{filepath.Join(dir, "pids.max"), pids},
		), nil
	}
	mem, cpu := c.Dir("memory"), c.Dir("cpu")
	limit := cgroupWrite{filepath.Join(mem, "memory.limit_in_bytes"), max(l.MemoryBytes, "-1")}
	memory := []cgroupWrite{limit}
	if swapAccounting {
		// The kernel keeps memsw.limit >= limit at every step: a cut
		// writes the limit first, a raise memsw first.
		memsw := cgroupWrite{filepath.Join(mem, "memory.memsw.limit_in_bytes"), limit.value}
		current, err := ReadInt(limit.file)
		if err != nil {
			return nil, err
		}
		if want := l.MemoryBytes; want <= 0 || want > current {
			memory = []cgroupWrite{memsw, limit}
		} else {
			memory = append(memory, memsw)
		}
	}
	return append(memory,
		cgroupWrite{filepath.Join(cpu, "cpu.cfs_period_us"), strconv.Itoa(CFSPeriod)},
		cgroupWrite{filepath.Join(cpu, "cpu.cfs_quota_us"), max(l.CPUQuota, "-1")},
		cgroupWrite{filepath.Join(c.Dir("pids"), "pids.max"), pids},
	), nil
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// writeAll writes each value to its file, in order. When one fails, the
// files written before it get back the values they held, the last first;
// the error then also says which of those could not be put back. undo does
// the same after a success.
func writeAll(writes []cgroupWrite) (undo func() error, err error) {
	var done []cgroupWrite // the files written, with their earlier values
	undo = func() error {
		var errs []error
		for i := len(done) - 1; i >= 0; i-- {
			w := done[i]
			if err := os.WriteFile(w.file, []byte(w.value), 0); err != nil {
				errs = append(errs, fmt.Errorf("restoring %s to %s: %w", filepath.Base(w.file), w.value, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, w := range writes {
		old, err := os.ReadFile(w.file)
		if err == nil {
			err = os.WriteFile(w.file, []byte(w.value), 0)
		}
		if err != nil {
			err = fmt.Errorf("setting %s to %s: %w", filepath.Base(w.file), w.value, err)
			if uerr := undo(); uerr != nil {
				err = fmt.Errorf("%w; undoing the limits set before it: %w", err, uerr)
			}
			return nil, err
		}
		done = append(done, cgroupWrite{w.file, strings.TrimSpace(string(old))})
	}
	return undo, nil
}
