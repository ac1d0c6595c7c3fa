package ocirt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// CgroupRoot is where the host mounts its cgroup hierarchies.
const CgroupRoot = "/sys/fs/cgroup"

// DetectCgroups reports whether the host runs the unified hierarchy only
// (cgroup v2) and, on v1, whether swap accounting is enabled. A hybrid host
// (v1 controllers, cgroup2 mounted without controllers at
// /sys/fs/cgroup/unified) counts as v1, as runc and runsc treat it.
func DetectCgroups() (v2, swapAccounting bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(CgroupRoot, &st); err != nil {
		return false, false, fmt.Errorf("inspecting %s: %w", CgroupRoot, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return true, false, nil
	}
	_, err = os.Stat(filepath.Join(CgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return false, err == nil, nil
}

// Cgroup is one sandbox's cgroup: Path (such as /corral/<id>) in every
// mounted hierarchy.
type Cgroup struct {
	V2   bool
	Path string
}

// Dir is the cgroup's directory in the v1 hierarchy of controller, or its
// only directory on v2.
func (c Cgroup) Dir(controller string) string {
	if c.V2 {
		return filepath.Join(CgroupRoot, c.Path)
	}
	return filepath.Join(CgroupRoot, controller, c.Path)
}

// Stats reads the cgroup's files directly; that takes microseconds where
// `runc events --stats` takes milliseconds. The error wraps
// errdefs.ErrNotFound when the cgroup does not exist.
func (c Cgroup) Stats() (driver.Stats, error) {
	var s driver.Stats
	if err := c.Exists(); err != nil {
		return s, err
	}
	var err error
	if c.V2 {
		dir := c.Dir("")
		if s.MemoryBytes, err = ReadInt(filepath.Join(dir, "memory.current")); err != nil {
			return s, err
		}
		usec, err := ReadKey(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return s, err
		}
		s.CPUUsageNanos = usec * 1000
		if s.Pids, err = ReadInt(filepath.Join(dir, "pids.current")); err != nil {
			return s, err
		}
		s.OOMKills, err = ReadKey(filepath.Join(dir, "memory.events"), "oom_kill")
		return s, err
	}
	mem := c.Dir("memory")
	if s.MemoryBytes, err = ReadInt(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, err
	}
	if s.CPUUsageNanos, err = ReadInt(filepath.Join(c.Dir("cpuacct"), "cpuacct.usage")); err != nil {
		return s, err
	}
	if s.Pids, err = ReadInt(filepath.Join(c.Dir("pids"), "pids.current")); err != nil {
		return s, err
	}
	// memory.oom_control has an "oom_kill N" line since Linux 4.13.
	s.OOMKills, err = ReadKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	return s, err
}

// OOMKills reads only the cgroup's OOM-kill count: one file, for the
// check around every exec (Stats reads four).
func (c Cgroup) OOMKills() (int64, error) {
	if c.V2 {
		return ReadKey(filepath.Join(c.Dir(""), "memory.events"), "oom_kill")
	}
	return ReadKey(filepath.Join(c.Dir("memory"), "memory.oom_control"), "oom_kill")
}

// InstanceStats is Stats of the cgroup that cgroup gives for instance id,
// after checking id, with errors that name it: the Stats of both drivers.
func InstanceStats(id string, cgroup func(string) Cgroup) (driver.Stats, error) {
	if err := driver.CheckID(id); err != nil {
		return driver.Stats{}, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	s, err := cgroup(id).Stats()
	if err != nil {
		return driver.Stats{}, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	return s, nil
}

// InstanceOOMKills is InstanceStats for the OOM-kill count alone
// (driver.OOMCounter).
func InstanceOOMKills(id string, cgroup func(string) Cgroup) (int64, error) {
	if err := driver.CheckID(id); err != nil {
		return 0, fmt.Errorf("reading OOM kills of %s: %w", id, err)
	}
	n, err := cgroup(id).OOMKills()
	if err != nil {
		return 0, fmt.Errorf("reading OOM kills of %s: %w", id, err)
	}
	return n, nil
}

// ReadInt reads a cgroup file that holds one number.
func ReadInt(name string) (int64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", name, err)
	}
	return v, nil
}

// ReadKey returns the value of the "key N" line of a flat-keyed cgroup
// file, or 0 when the key is absent.
func ReadKey(name, key string) (int64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing %s in %s: %w", key, name, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// Frozen reports whether the cgroup's freezer holds it frozen.
func (c Cgroup) Frozen() bool {
	if c.V2 {
		b, err := os.ReadFile(filepath.Join(c.Dir(""), "cgroup.freeze"))
		return err == nil && string(bytes.TrimSpace(b)) == "1"
	}
	b, err := os.ReadFile(filepath.Join(c.Dir("freezer"), "freezer.state"))
	return err == nil && string(bytes.TrimSpace(b)) != "THAWED"
}

// Dirs returns the directories the cgroup has or would have in every
// mounted hierarchy: one per v1 controller mount (and the named systemd
// and hybrid unified trees), or the single v2 one.
func (c Cgroup) Dirs() []string {
	if c.V2 {
		return []string{c.Dir("")}
	}
	entries, _ := os.ReadDir(CgroupRoot)
	var out []string
	for _, e := range entries {
		// Co-mounted controllers appear as symlinks (cpu -> cpu,cpuacct);
		// the real mount covers them.
		if e.IsDir() {
			out = append(out, filepath.Join(CgroupRoot, e.Name(), c.Path))
		}
	}
	return out
}

// Remove removes the cgroup's directories. Runtimes remove them on
// delete, but not always after a failed start; a directory is busy for a
// moment after its last task died, so rmdir is retried briefly, killing
// the tasks still in it: they belong to this sandbox alone.
func (c Cgroup) Remove() error {
	deadline := time.Now().Add(2 * time.Second)
	for _, dir := range c.Dirs() {
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", dir, err)
			}
			killTasks(dir)
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// Procs returns the processes in the cgroup (its pids hierarchy on v1).
// Zombies are not listed.
func (c Cgroup) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir("pids"), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Kill thaws the cgroup if it is frozen and sends SIGKILL to every
// process in it.
func (c Cgroup) Kill() {
	if c.V2 {
		// cgroup.kill kills frozen tasks too (Linux 5.14).
		if os.WriteFile(filepath.Join(c.Dir(""), "cgroup.kill"), []byte("1"), 0) == nil {
			return
		}
		_ = os.WriteFile(filepath.Join(c.Dir(""), "cgroup.freeze"), []byte("0"), 0)
		killTasks(c.Dir(""))
		return
	}
	_ = os.WriteFile(filepath.Join(c.Dir("freezer"), "freezer.state"), []byte("THAWED"), 0)
	killTasks(c.Dir("pids"))
}

// killTasks thaws the cgroup at dir if it is a frozen v1 freezer cgroup
// and sends SIGKILL to every process in it.
func killTasks(dir string) {
	state := filepath.Join(dir, "freezer.state")
	if b, err := os.ReadFile(state); err == nil && string(bytes.TrimSpace(b)) != "THAWED" {
		_ = os.WriteFile(state, []byte("THAWED"), 0)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// Exists reports whether the cgroup's memory (v1) or unified (v2)
// directory exists, which is how drivers tell an unknown sandbox; the
// error wraps errdefs.ErrNotFound when it does not.
func (c Cgroup) Exists() error {
	if _, err := os.Stat(c.Dir("memory")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.ErrNotFound
		}
		return err
	}
	return nil
}

// Freeze freezes (or thaws) every task of the cgroup through its freezer
// and waits until the kernel reports the new state: the same thing `runc
// pause` and `runc resume` do, without starting a process. runc reads the freezer to tell a
// paused container, so `runc state` and `runc delete` agree with it.
func (c Cgroup) Freeze(ctx context.Context, frozen bool) error {
	file, value, done := filepath.Join(c.Dir("freezer"), "freezer.state"), "THAWED", "THAWED"
	if frozen {
		value, done = "FROZEN", "FROZEN"
	}
	if c.V2 {
		file, value, done = filepath.Join(c.Dir(""), "cgroup.freeze"), "0", "frozen 0"
		if frozen {
			value, done = "1", "frozen 1"
		}
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Callers name the sandbox; the cgroup's path is the host's.
			return errdefs.Errorf(errdefs.ErrNotFound, "the sandbox's cgroup is gone")
		}
		return fmt.Errorf("writing %s: %w", file, err)
	}
	state := file
	if c.V2 {
		state = filepath.Join(c.Dir(""), "cgroup.events")
	}
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		b, err := os.ReadFile(state)
		if err != nil {
			return fmt.Errorf("reading %s: %w", state, err)
		}
		if bytes.Contains(b, []byte(done)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to become %s: %w", state, done, ctx.Err())
		case <-time.After(wait):
		}
	}
}
