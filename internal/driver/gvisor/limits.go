package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/agent"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
)

// cfsPeriod is the CFS period in microseconds; quotas are relative to it.
const cfsPeriod = 100000

// hostLimits are the limits of a sandbox's host cgroup for the requested
// r; zero fields are unlimited. See the package documentation for the
// overheads.
type hostLimits struct {
	memory, pids, cpuQuota int64
}

func (d *Driver) hostLimits(r driver.Resources) hostLimits {
	var l hostLimits
	if r.MemoryBytes > 0 {
		l.memory = r.MemoryBytes + d.cfg.MemoryOverhead
	}
	if r.Pids > 0 {
		l.pids = r.Pids*hostTasksPerTask() + d.cfg.PidsOverhead
	}
	if r.MilliCPUs > 0 {
		l.cpuQuota = r.MilliCPUs * cfsPeriod / 1000
	}
	return l
}

// hostTasksPerTask bounds the host tasks one task inside gVisor costs on
// the systrap platform: a stub process for its address space with up to
// GOMAXPROCS+1 threads of its own (GOMAXPROCS is at most the host's CPUs),
// and a Sentry thread while it blocks in a host system call.
func hostTasksPerTask() int64 { return int64(runtime.NumCPU()) + 3 }

// controllers are the v1 hierarchies the driver makes the sandbox's
// cgroup in and sets; runsc makes the others (cpuset, devices, ...) from
// the spec.
var controllers = []string{"memory", "cpu", "pids"}

// makeCgroup creates sandbox id's host cgroup with the limits for r, so
// that runsc finds it and uses it as it is.
func (d *Driver) makeCgroup(id string, r driver.Resources) error {
	cg := d.cgroup(id)
	if cg.V2 {
		if err := makeV2(cg.Path); err != nil {
			return err
		}
	} else {
		for _, c := range controllers {
			if err := os.MkdirAll(cg.Dir(c), 0o755); err != nil {
				return fmt.Errorf("creating cgroup: %w", err)
			}
		}
		// No swap: the limit is on memory, not memory plus swap.
		if err := writeCgroup(cg.Dir("memory"), "memory.swappiness", "0"); err != nil {
			return err
		}
	}
	return d.setCgroup(cg, r)
}

// makeV2 creates the v2 cgroup p and enables the memory, cpu and pids
// controllers for it in every cgroup above it.
func makeV2(p string) error {
	dir := ocirt.CgroupRoot
	for _, part := range strings.Split(strings.Trim(p, "/"), "/") {
		if err := writeCgroup(dir, "cgroup.subtree_control", "+memory +cpu +pids"); err != nil {
			return err
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating cgroup: %w", err)
		}
	}
	return nil
}

// setCgroup writes the host limits for r into cg.
func (d *Driver) setCgroup(cg ocirt.Cgroup, r driver.Resources) error {
	l := d.hostLimits(r)
	max := func(v int64, unlimited string) string {
		if v > 0 {
			return strconv.FormatInt(v, 10)
		}
		return unlimited
	}
	if cg.V2 {
		dir := cg.Dir("")
		for _, f := range []struct{ name, value string }{
			{"memory.max", max(l.memory, "max")},
			{"memory.swap.max", "0"},
			{"cpu.max", max(l.cpuQuota, "max") + " " + strconv.Itoa(cfsPeriod)},
			{"pids.max", max(l.pids, "max")},
		} {
			if err := writeCgroup(dir, f.name, f.value); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.setMemoryV1(cg.Dir("memory"), max(l.memory, "-1")); err != nil {
		return err
	}
	cpu := cg.Dir("cpu")
	if err := writeCgroup(cpu, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err != nil {
		return err
	}
	if err := writeCgroup(cpu, "cpu.cfs_quota_us", max(l.cpuQuota, "-1")); err != nil {
		return err
	}
	return writeCgroup(cg.Dir("pids"), "pids.max", max(l.pids, "max"))
}

// setMemoryV1 sets the memory limit and, with swap accounting, the same
// memory+swap limit. The kernel keeps memsw.limit >= limit at every step,
// so a cut writes the limit first and a raise writes memsw first.
func (d *Driver) setMemoryV1(dir, limit string) error {
	first, second := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
	if !d.host.SwapAccounting {
		return writeCgroup(dir, first, limit)
	}
	if err := writeCgroup(dir, first, limit); errors.Is(err, unix.EINVAL) {
		first, second = second, first
		if err := writeCgroup(dir, first, limit); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return writeCgroup(dir, second, limit)
}

func writeCgroup(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("setting cgroup %s: %w", file, err)
	}
	return nil
}

// innerCgroup is where gVisor's cgroupfs, mounted by the spec at
// /sys/fs/cgroup with one hierarchy per controller (cgroup v1, whatever
// the host runs), shows the sandbox's own cgroup.
const innerCgroup = "/sys/fs/cgroup"

// innerUnlimited is what Linux shows as "no memory limit" in
// memory.limit_in_bytes (PAGE_COUNTER_MAX pages).
const innerUnlimited = "9223372036854771712"

// innerLimitFiles are the files inside gVisor that hold r's pids and
// memory limits, with their values: gVisor enforces pids.max itself (a
// fork past it fails with EAGAIN, where a full host pids limit crashes
// the Sentry), and memory.limit_in_bytes is what programs read to size
// themselves. Zero fields are left out unless lift is set, when they are
// written as unlimited.
func innerLimitFiles(r driver.Resources, lift bool) [][2]string {
	var files [][2]string
	if r.Pids > 0 || lift {
		v := "max"
		if r.Pids > 0 {
			v = strconv.FormatInt(r.Pids, 10)
		}
		files = append(files, [2]string{path.Join(innerCgroup, "pids", "pids.max"), v})
	}
	if r.MemoryBytes > 0 || lift {
		v := innerUnlimited
		if r.MemoryBytes > 0 {
			v = strconv.FormatInt(r.MemoryBytes, 10)
		}
		files = append(files, [2]string{path.Join(innerCgroup, "memory", "memory.limit_in_bytes"), v})
	}
	return files
}

// writeLimitsFile writes files, as FILE=VALUE lines, to path, for a new
// sandbox's agent to write inside gVisor before it serves (agentd
// --limits): about 10 ms less per create than setInnerLimits.
func writeLimitsFile(path string, files [][2]string) error {
	var b strings.Builder
	for _, f := range files {
		b.WriteString(f[0] + "=" + f[1] + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o444); err != nil {
		return fmt.Errorf("writing limits for the agent: %w", err)
	}
	return nil
}

// setInnerLimits writes r's limits inside gVisor (innerLimitFiles)
// through the agent's file API, for a running or restored sandbox; a new
// one's agent writes them itself before it serves (writeLimitsFile).
// Cost: one round trip through the agent per file, a few milliseconds.
func (d *Driver) setInnerLimits(ctx context.Context, id string, r driver.Resources, lift bool) error {
	files := innerLimitFiles(r, lift)
	if len(files) == 0 {
		return nil
	}
	c := agent.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	for _, f := range files {
		if _, err := c.WriteFile(ctx, f[0], 0o644, strings.NewReader(f[1])); err != nil {
			return fmt.Errorf("setting %s inside gVisor: %w", f[0], err)
		}
	}
	return nil
}

// innerPidsTimeout bounds innerPids: a paused sandbox's agent does not
// answer.
const innerPidsTimeout = 200 * time.Millisecond

// innerPids reads pids.current of the sandbox's cgroup inside gVisor
// through the agent's file API, a round trip of about half a millisecond
// (`runsc events` takes 30 ms, and the Manager reads stats before every
// exec). The agent answers for the sandbox, which could lie about its own
// count; the limits do not depend on it. 0 when it does not answer in
// time (paused, stopped).
func (d *Driver) innerPids(ctx context.Context, id string) int64 {
	ctx, cancel := context.WithTimeout(ctx, innerPidsTimeout)
	defer cancel()
	c := agent.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	r, _, err := c.ReadFile(ctx, path.Join(innerCgroup, "pids", "pids.current"))
	if err != nil {
		return 0
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 32))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
