package runc

import (
	"bufio"
	"bytes"
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

// cgroupRoot is where the host mounts its cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// detectCgroups reports whether the host runs the unified hierarchy only
// (cgroup v2) and, on v1, whether swap accounting is enabled. A hybrid host
// (v1 controllers, cgroup2 mounted without controllers at
// /sys/fs/cgroup/unified) counts as v1, as runc treats it.
func detectCgroups() (v2, swapAccounting bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return false, false, fmt.Errorf("inspecting %s: %w", cgroupRoot, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return true, false, nil
	}
	_, err = os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return false, err == nil, nil
}

// cgroupStats reads the cgroup files of the container at cgroup path p
// directly; that takes microseconds where `runc events --stats` takes
// milliseconds.
func cgroupStats(v2 bool, p string) (driver.Stats, error) {
	var s driver.Stats
	var err error
	if v2 {
		dir := filepath.Join(cgroupRoot, p)
		if s.MemoryBytes, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
			return s, err
		}
		usec, err := readKey(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return s, err
		}
		s.CPUUsageNanos = usec * 1000
		if s.Pids, err = readInt(filepath.Join(dir, "pids.current")); err != nil {
			return s, err
		}
		s.OOMKills, err = readKey(filepath.Join(dir, "memory.events"), "oom_kill")
		return s, err
	}
	mem := filepath.Join(cgroupRoot, "memory", p)
	if s.MemoryBytes, err = readInt(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, err
	}
	if s.CPUUsageNanos, err = readInt(filepath.Join(cgroupRoot, "cpuacct", p, "cpuacct.usage")); err != nil {
		return s, err
	}
	if s.Pids, err = readInt(filepath.Join(cgroupRoot, "pids", p, "pids.current")); err != nil {
		return s, err
	}
	// memory.oom_control has an "oom_kill N" line since Linux 4.13.
	s.OOMKills, err = readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	return s, err
}

func readInt(name string) (int64, error) {
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

// readKey returns the value of the "key N" line of a flat-keyed cgroup
// file, or 0 when the key is absent.
func readKey(name, key string) (int64, error) {
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

// frozen reports whether the container's freezer holds it frozen.
func frozen(v2 bool, p string) bool {
	if v2 {
		b, err := os.ReadFile(filepath.Join(cgroupRoot, p, "cgroup.freeze"))
		return err == nil && string(bytes.TrimSpace(b)) == "1"
	}
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "freezer", p, "freezer.state"))
	return err == nil && string(bytes.TrimSpace(b)) != "THAWED"
}

// cgroupDirs returns the directories that cgroup path p has or would have
// in every mounted hierarchy: one per v1 controller mount (and the named
// systemd and hybrid unified trees), or the single v2 one.
func cgroupDirs(v2 bool, p string) []string {
	if v2 {
		return []string{filepath.Join(cgroupRoot, p)}
	}
	entries, _ := os.ReadDir(cgroupRoot)
	var out []string
	for _, e := range entries {
		// Co-mounted controllers appear as symlinks (cpu -> cpu,cpuacct);
		// the real mount covers them.
		if e.IsDir() {
			out = append(out, filepath.Join(cgroupRoot, e.Name(), p))
		}
	}
	return out
}

// removeCgroups removes the container's cgroup directories. runc removes
// them on delete, but not always after a failed start; a directory is busy
// for a moment after its last task died, so rmdir is retried briefly.
func removeCgroups(v2 bool, p string) error {
	deadline := time.Now().Add(2 * time.Second)
	for _, dir := range cgroupDirs(v2, p) {
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", dir, err)
			}
			// Tasks left behind by an interrupted runc run keep the
			// cgroup busy; they belong to this sandbox alone.
			killTasks(dir)
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
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

// cgroupExists reports whether the container's memory (v1) or unified (v2)
// cgroup exists, which is how Stats tells an unknown sandbox.
func cgroupExists(v2 bool, p string) error {
	dir := filepath.Join(cgroupRoot, p)
	if !v2 {
		dir = filepath.Join(cgroupRoot, "memory", p)
	}
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.ErrNotFound
		}
		return err
	}
	return nil
}
