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

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
)

// hostLimits are the limits of a sandbox's host cgroup for the requested
// r; zero fields are unlimited. See the package documentation for the
// overheads.
func (d *Driver) hostLimits(r driver.Resources) ocirt.Limits {
	l := ocirt.LimitsOf(r)
	if r.MemoryBytes > 0 {
		l.MemoryBytes += d.cfg.MemoryOverhead
	}
	if r.Pids > 0 {
		l.Pids = r.Pids*hostTasksPerTask() + d.cfg.PidsOverhead
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

// makeCgroup creates sandbox id's host cgroup with the limits for r but
// no CPU quota, so that runsc finds it and uses it as it is. The quota
// comes once the sandbox has started (see start): booting gVisor takes
// more CPU time than its wall time on more than one core, and under a
// quota of one core or less the kernel would throttle the boot for whole
// CFS periods. The boot is gVisor's work, not the sandbox's; memory and
// pids are limited from the first moment.
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
	boot := d.hostLimits(r)
	boot.CPUQuota = 0
	_, err := cg.SetLimits(boot, d.host.SwapAccounting)
	return err
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

// setCgroup writes the host limits for r into cg, all or nothing
// (ocirt.Cgroup.SetLimits).
func (d *Driver) setCgroup(cg ocirt.Cgroup, r driver.Resources) (undo func() error, err error) {
	return cg.SetLimits(d.hostLimits(r), d.host.SwapAccounting)
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

// innerLimitFiles are the files inside gVisor that hold r's pids, memory
// and CPU limits, with their values: gVisor enforces pids.max itself (a
// fork past it fails with EAGAIN, where a full host pids limit crashes
// the Sentry), and memory.limit_in_bytes and cpu.cfs_quota_us are what
// programs read to size themselves (the host cgroup enforces both).
// gVisor would show the host's CPU quota of the moment it started, which
// a sandbox starts without (makeCgroup), so it is written here too. Zero
// fields are left out unless lift is set, when they are written as
// unlimited.
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
	if r.MilliCPUs > 0 || lift {
		v := "-1"
		if q := ocirt.LimitsOf(r).CPUQuota; q > 0 {
			v = strconv.FormatInt(q, 10)
		}
		files = append(files, [2]string{path.Join(innerCgroup, "cpu", "cpu.cfs_quota_us"), v})
	}
	return files
}

// limitLines are files as the FILE=VALUE lines that a new sandbox's agent
// writes inside gVisor before it serves (corral agent --limits-env),
// which spares a create the round trips of setInnerLimits.
func limitLines(files [][2]string) string {
	var b strings.Builder
	for _, f := range files {
		b.WriteString(f[0] + "=" + f[1] + "\n")
	}
	return b.String()
}

// setInnerLimits writes r's limits inside gVisor (innerLimitFiles)
// through the agent's file API, for a running or restored sandbox; a new
// one's agent writes them itself before it serves (limitLines). When
// one cannot be written, those written before it get their earlier values
// back. Cost: two round trips through the agent per file (the earlier
// value, then the new one), a few milliseconds.
func (d *Driver) setInnerLimits(ctx context.Context, id string, r driver.Resources, lift bool) error {
	files := innerLimitFiles(r, lift)
	if len(files) == 0 {
		return nil
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	var done [][2]string // the files written, with their earlier values
	for _, f := range files {
		old, err := readInner(ctx, c, f[0])
		if err == nil {
			_, err = c.WriteFile(ctx, f[0], 0o644, strings.NewReader(f[1]))
		}
		if err == nil {
			done = append(done, [2]string{f[0], old})
			continue
		}
		err = fmt.Errorf("setting %s inside gVisor: %w", f[0], err)
		// The undo runs even when ctx ended the update: the limits inside
		// must not stay half changed.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for i := len(done) - 1; i >= 0; i-- {
			if _, uerr := c.WriteFile(uctx, done[i][0], 0o644, strings.NewReader(done[i][1])); uerr != nil {
				err = fmt.Errorf("%w; restoring %s inside gVisor: %w", err, done[i][0], uerr)
			}
		}
		return err
	}
	return nil
}

// readInner reads a small file inside gVisor through the agent c.
func readInner(ctx context.Context, c *agentclient.Client, name string) (string, error) {
	r, _, err := c.ReadFile(ctx, name)
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 64))
	return strings.TrimSpace(string(b)), err
}

// innerPidsTimeout bounds innerPids: a paused sandbox's agent does not
// answer.
const innerPidsTimeout = 200 * time.Millisecond

// innerPids reads pids.current of the sandbox's cgroup inside gVisor
// through the agent's file API, one round trip, rather than with `runsc
// events`, which starts a process, since the Manager reads stats before
// every exec. The agent answers for the sandbox, which could lie about its own
// count; the limits do not depend on it. 0 when it does not answer in
// time (paused, stopped).
func (d *Driver) innerPids(ctx context.Context, id string) int64 {
	ctx, cancel := context.WithTimeout(ctx, innerPidsTimeout)
	defer cancel()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	v, err := readInner(ctx, c, path.Join(innerCgroup, "pids", "pids.current"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// Update replaces the sandbox's CPU, memory and pids limits, in its host
// cgroup (with the overheads) and then inside gVisor, all or nothing: when
// the limits inside cannot be set, the host cgroup's are put back. Zero
// fields lift a limit. It writes the cgroup itself rather than through
// `runsc update`, which leaves alone a cgroup it did not make and knows
// nothing of the limits inside.
func (d *Driver) Update(ctx context.Context, id string, r driver.Resources) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	cg := d.cgroup(id)
	if err := cg.Exists(); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	undo, err := d.setCgroup(cg, r)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	if err := d.setInnerLimits(ctx, id, r, true); err != nil {
		if uerr := undo(); uerr != nil {
			err = fmt.Errorf("%w; restoring the host cgroup's limits: %w", err, uerr)
		}
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	return nil
}
