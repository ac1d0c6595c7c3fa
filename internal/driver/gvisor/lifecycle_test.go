package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// checkNothingLeft fails unless the driver holds nothing: no runsc state,
// no sandbox directory, box, mount or agent socket, no listener, no
// cgroup, no runsc process of this driver and no zombie of this process.
func checkNothingLeft(t *testing.T, d *Driver, e env) {
	t.Helper()
	if ids, err := d.List(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("List() = %v, %v; want empty", ids, err)
	}
	if entries, err := os.ReadDir(d.boxesDir); err != nil || len(entries) != 0 {
		t.Errorf("sandbox directories left: %v, %v", entries, err)
	}
	d.mu.Lock()
	if len(d.listeners) != 0 {
		t.Errorf("listeners left: %v", d.listeners)
	}
	d.mu.Unlock()
	if entries, err := os.ReadDir(d.cfg.MountDir); err != nil || len(entries) != 0 {
		t.Errorf("sandbox boxes left: %v, %v", entries, err)
	}
	if m := testutil.Mounts(t, d.cfg.MountDir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if dirs := testutil.CgroupDirs(t, e.cgroupParent); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if pids := runscProcesses(d.stateDir); len(pids) != 0 {
		t.Errorf("runsc processes left: %v", pids)
	}
	if z := zombies(); len(z) != 0 {
		t.Errorf("unreaped children: %v", z)
	}
}

// runscProcesses returns the processes whose command line names the runsc
// state directory root: sandboxes and gofers of a driver.
func runscProcesses(root string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "--root="+root+"\x00") {
			out = append(out, e.Name())
		}
	}
	return out
}

// zombies returns this process's children that exited and were not
// reaped.
func zombies() []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && ocirt.ParentPid(pid) == os.Getpid() && ocirt.ProcState(pid) == 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

// startFailures are the ways a gVisor sandbox's start can fail: an agent
// that never connects or is no program, a missing root, and runsc itself.
var startFailures = []drivertest.StartFailure{
	{Name: "exit before connecting", Agent: `echo "dying early" >&2; exit 3`, Want: "dying early"},
	{Name: "timeout", Agent: `sleep 60`, Timeout: time.Second, WantErr: context.DeadlineExceeded},
	{Name: "canceled while waiting", Agent: `sleep 60`, Cancel: 700 * time.Millisecond, WantErr: context.Canceled},
	{Name: "canceled during runsc run", Agent: `sleep 60`, Cancel: 10 * time.Millisecond, WantErr: context.Canceled},
	{Name: "agent not executable", Agent: "", Want: "exec format error"},
	{Name: "missing root", Agent: "exec sleep 60", MissingRoot: true, Want: "no such file or directory", WantErr: errdefs.ErrInvalidArgument},
	// An unknown platform makes runsc fail.
	{Name: "runsc fails", Agent: "exec sleep 60", BreakRuntime: true, Want: "nope"},
}

// TestTakeOver checks that a second driver on the same root (a restarted
// daemon) sees the first one's sandbox, that its agent connects to the new
// driver, and that a half-made sandbox directory is listed and deleted.
func TestTakeOver(t *testing.T) {
	e := newEnv(t)
	d1 := e.newDriver(t, nil)
	ctx := t.Context()
	if err := d1.Create(ctx, driver.Spec{ID: "keep", RootFS: e.rootfs(t)}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d1.dir("half"), 0o700); err != nil {
		t.Fatal(err)
	}
	d1.Close()
	d2, err := New(d1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	ids, err := d2.List(ctx)
	if err != nil || strings.Join(ids, ",") != "half,keep" {
		t.Fatalf("List() = %v, %v; want [half keep]", ids, err)
	}
	if st, err := d2.Status(ctx, "keep"); err != nil || st != driver.StatusRunning {
		t.Fatalf("Status(keep) = %s, %v", st, err)
	}
	if st, err := d2.Status(ctx, "half"); err != nil || st != driver.StatusUnknown {
		t.Fatalf("Status(half) = %s, %v", st, err)
	}
	t0 := time.Now()
	if out, err := drivertest.ExecOnce(ctx, d2, "keep", "echo back"); err != nil || out != "back\n" {
		t.Fatalf("exec after take-over: %q, %v", out, err)
	}
	t.Logf("the agent reconnected and ran a command %v after the new driver started", time.Since(t0))
	for _, id := range ids {
		if err := d2.Delete(ctx, id); err != nil {
			t.Fatalf("Delete(%s): %v", id, err)
		}
	}
	checkNothingLeft(t, d2, e)
}

// TestStoppedSandbox checks a sandbox whose Sentry was killed from the
// host: stopped, and deletable.
func TestStoppedSandbox(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "dies", RootFS: e.rootfs(t)}); err != nil {
		t.Fatal(err)
	}
	pid, err := ocirt.ReadPid(filepath.Join(d.dir("dies"), pidFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	drivertest.WaitStatus(t, d, "dies", driver.StatusStopped, 5*time.Second)
	if err := d.Delete(ctx, "dies"); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, d, e)
}

func readCgroup(t *testing.T, controller, p, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ocirt.CgroupRoot, controller, p, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestLimitsAndUpdate checks the host cgroup (the request plus the
// overheads) and the limits seen and enforced inside, at create, after
// Update and after an Update the kernel refuses half-way.
func TestLimitsAndUpdate(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	if d.cgroupsV2 {
		t.Skip("checks v1 cgroup files")
	}
	ctx := t.Context()
	id := "upd"
	if err := d.Create(ctx, driver.Spec{ID: id, RootFS: e.rootfs(t), Resources: driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 500, Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	cg := d.cgroup(id).Path
	tasks := hostTasksPerTask()
	check := func(mem, quota, pids int64, inside string) {
		t.Helper()
		hostMem := strconv.FormatInt(mem+DefaultMemoryOverhead, 10)
		if got := readCgroup(t, "memory", cg, "memory.limit_in_bytes"); got != hostMem {
			t.Errorf("memory.limit_in_bytes = %s, want %s", got, hostMem)
		}
		if d.host.SwapAccounting {
			if got := readCgroup(t, "memory", cg, "memory.memsw.limit_in_bytes"); got != hostMem {
				t.Errorf("memory.memsw.limit_in_bytes = %s, want %s", got, hostMem)
			}
		}
		if got := readCgroup(t, "cpu", cg, "cpu.cfs_quota_us"); got != strconv.FormatInt(quota, 10) {
			t.Errorf("cpu.cfs_quota_us = %s, want %d", got, quota)
		}
		hostPids := strconv.FormatInt(pids*tasks+DefaultPidsOverhead, 10)
		if got := readCgroup(t, "pids", cg, "pids.max"); got != hostPids {
			t.Errorf("pids.max = %s, want %s", got, hostPids)
		}
		out, err := drivertest.ExecOnce(ctx, d, id, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
		if err != nil || out != inside {
			t.Errorf("limits inside = %q, %v; want %q", out, err, inside)
		}
	}
	check(128<<20, 50000, 100, fmt.Sprintf("%d\n100\n50000\n", 128<<20))
	if err := d.Update(ctx, id, driver.Resources{MemoryBytes: 256 << 20, MilliCPUs: 2000, Pids: 200}); err != nil {
		t.Fatal(err)
	}
	check(256<<20, 200000, 200, fmt.Sprintf("%d\n200\n200000\n", 256<<20))
	if err := d.Update(ctx, id, driver.Resources{MemoryBytes: 64 << 20, MilliCPUs: 500, Pids: 50}); err != nil {
		t.Fatal(err)
	}
	check(64<<20, 50000, 50, fmt.Sprintf("%d\n50\n50000\n", 64<<20))
	// The kernel refuses a CPU quota under 1 ms after the memory limit
	// was set: the update leaves every limit, outside and inside, as it was.
	if err := d.Update(ctx, id, driver.Resources{MemoryBytes: 256 << 20, MilliCPUs: 1, Pids: 80}); err == nil {
		t.Fatal("Update with a CPU quota of 100 µs per 100 ms succeeded")
	}
	check(64<<20, 50000, 50, fmt.Sprintf("%d\n50\n50000\n", 64<<20))
	out, err := drivertest.ExecOnce(ctx, d, id, `i=0; while [ $i -lt 100 ]; do sleep 60 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned all`)
	if err != nil || strings.Contains(out, "spawned all") || !strings.Contains(out, "can't fork") {
		t.Errorf("100 processes under an updated pids limit of 50: %q, %v", out, err)
	}
}

// TestBootUnthrottled checks that a sandbox's CPU quota comes after its
// boot: gVisor's boot takes far more than a tenth of a core, yet a
// sandbox limited to that is never throttled until it runs something,
// and then it is.
func TestBootUnthrottled(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	if d.cgroupsV2 {
		t.Skip("checks v1 cgroup files")
	}
	ctx := t.Context()
	id := "slow"
	if err := d.Create(ctx, driver.Spec{ID: id, RootFS: e.rootfs(t), Resources: driver.Resources{MilliCPUs: 100}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	cg := d.cgroup(id).Path
	throttled := func() string {
		for line := range strings.Lines(readCgroup(t, "cpu", cg, "cpu.stat")) {
			if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatal("no nr_throttled in cpu.stat")
		return ""
	}
	if got := readCgroup(t, "cpu", cg, "cpu.cfs_quota_us"); got != "10000" {
		t.Errorf("cpu.cfs_quota_us after Create = %s, want 10000", got)
	}
	if n := throttled(); n != "0" {
		t.Errorf("nr_throttled after Create = %s, want 0", n)
	}
	if _, err := drivertest.ExecOnce(ctx, d, id, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"); err != nil {
		t.Fatal(err)
	}
	if n := throttled(); n == "0" {
		t.Error("a busy loop under a tenth of a core was never throttled")
	}
}

// TestCheckpointPaused checks the order a fork with a consistent file
// system takes (pause, copy the root, checkpoint, resume): the checkpoint
// of a paused sandbox leaves it paused, its agent answers at once after
// Resume, and the image restores into a copy.
func TestCheckpointPaused(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	root := e.rootfs(t)
	if err := d.Create(ctx, driver.Spec{ID: "orig", RootFS: root}); err != nil {
		t.Fatal(err)
	}
	if _, err := drivertest.ExecOnce(ctx, d, "orig", "echo before > /root/f"); err != nil {
		t.Fatal(err)
	}
	if err := d.Pause(ctx, "orig"); err != nil {
		t.Fatal(err)
	}
	croot := copyTree(t, root)
	image := t.TempDir()
	if err := d.Checkpoint(ctx, "orig", image, true); err != nil {
		t.Fatalf("Checkpoint of a paused sandbox: %v", err)
	}
	drivertest.WaitStatus(t, d, "orig", driver.StatusPaused, time.Second)
	if err := d.Resume(ctx, "orig"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if out, err := drivertest.ExecOnce(ctx, d, "orig", "cat /root/f"); err != nil || out != "before\n" || time.Since(t0) > 2*time.Second {
		t.Fatalf("exec after resume: %q, %v after %v", out, err, time.Since(t0))
	}
	if err := d.Restore(ctx, "copy", driver.Spec{RootFS: croot}, image); err != nil {
		t.Fatal(err)
	}
	if out, err := drivertest.ExecOnce(ctx, d, "copy", "cat /root/f"); err != nil || out != "before\n" {
		t.Fatalf("exec in the copy: %q, %v", out, err)
	}
	// The image names the agent's argv, and the restored agent's spawner
	// thread still carries the filter that its processes inherit.
	if b, err := os.ReadFile(filepath.Join(image, argsFile)); err != nil || !strings.Contains(string(b), spawnThreadFlag) {
		t.Errorf("%s in the image: %q, %v", argsFile, b, err)
	}
	if out, err := drivertest.ExecOnce(ctx, d, "copy", "grep '^Seccomp:' /proc/self/status; unshare -U true && echo unshared"); err != nil ||
		!strings.HasPrefix(out, "Seccomp:\t2\n") || strings.Contains(out, "unshared") {
		t.Errorf("process in the copy: %q, %v", out, err)
	}
	for _, id := range []string{"orig", "copy"} {
		if err := d.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	checkNothingLeft(t, d, e)
}
