package runc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/testutil"
)

func TestMain(m *testing.M) { testutil.SubreaperMain(m) }

// env is what the runc tests share: a cgroup parent unique to the test
// (removed at its end) and the agent binary.
type env struct {
	cgroupParent string
	agent        string
}

func newEnv(t testing.TB) env {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	return env{cgroupParent: testutil.CgroupParent(t), agent: testutil.AgentBinary(t)}
}

// newDriver returns a driver with its own short root (unix socket paths
// are limited to 107 bytes) and its own running reaper.
func (e env) newDriver(t testing.TB, mod func(*Config)) *Driver {
	t.Helper()
	root, rp := testutil.DriverDeps(t)
	cfg := Config{Root: root, AgentPath: e.agent, CgroupParent: e.cgroupParent, Reaper: rp}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestSealedRunc: the driver runs runc from a sealed copy, which runc
// takes for its own safe copy (ocirt.Sealed); so do the other tests here.
func TestSealedRunc(t *testing.T) {
	d := newEnv(t).newDriver(t, nil)
	if d.cli.Sealed == nil {
		msg := "runc runs from its file (see the driver's log)"
		if testutil.Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cmd := d.cli.Command(t.Context(), "list")
	if !strings.HasPrefix(cmd.Path, "/proc/") {
		t.Errorf("runc runs from %s, not from the sealed copy", cmd.Path)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("runc list from the sealed copy: %v %s", err, out)
	}
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	for _, v := range []struct {
		userns bool
		spares int
	}{{false, 0}, {true, 0}, {true, 2}} {
		userns := v.userns
		t.Run(fmt.Sprintf("userns=%v,spares=%d", userns, v.spares), func(t *testing.T) {
			drivertest.Run(t, drivertest.Harness{
				New: func(t *testing.T) driver.Driver {
					return e.newDriver(t, func(c *Config) { c.UserNamespaces, c.UserNSSpares = userns, v.spares })
				},
				RootFS: func(t *testing.T) string {
					rootfs := testutil.BusyboxRootfs(t)
					if userns {
						if err := makeAgentMountPoint(rootfs); err != nil {
							t.Fatal(err)
						}
						if err := shiftOwners(rootfs); err != nil {
							t.Fatal(err)
						}
					}
					return rootfs
				},
				CgroupParent: e.cgroupParent,
				Features:     drivertest.Features{Limits: true, ProcessIsolation: true, Freeze: true, Mounts: true},
				NewWithAgent: func(t *testing.T, agent string, f drivertest.StartFailure) driver.Driver {
					return e.newDriver(t, func(c *Config) {
						c.UserNamespaces, c.UserNSSpares = userns, v.spares
						c.AgentPath = agent
						if f.Timeout > 0 {
							c.StartTimeout = f.Timeout
						}
					})
				},
				StartFailures: startFailures,
				ErrorPrefix:   "creating container ",
				NothingLeft: func(t *testing.T, d driver.Driver, id, rootfs string) {
					checkNothingLeft(t, d.(*Driver), e, id, rootfs)
				},
			})
		})
	}
}

// startFailures are the ways an agent can fail the runc driver's start-up
// contract (ready or an error line on fd 3), and runc failing under a
// ready agent.
var startFailures = []drivertest.StartFailure{
	{Name: "error line", Agent: `echo "starting up"; echo "error: no disk" >&3; exit 1`, Want: "no disk"},
	{Name: "exit before ready", Agent: `echo "dying early" >&2; exit 3`, Want: "dying early"},
	{Name: "timeout", Agent: `sleep 60`, Timeout: 300 * time.Millisecond, WantErr: context.DeadlineExceeded},
	{Name: "canceled while waiting", Agent: `sleep 60`, Cancel: 300 * time.Millisecond, WantErr: context.Canceled},
	{Name: "canceled during runc run", Agent: `sleep 60`, Cancel: 10 * time.Millisecond, WantErr: context.Canceled},
	{Name: "agent not executable", Agent: "", Want: "exec format error"},
	{Name: "runc fails", Agent: "echo ok >&3; exec sleep 60", MissingRoot: true, Want: "no such file or directory"},
}

// checkNothingLeft fails unless the driver holds nothing for id: no runc
// state, no sandbox directory, no cgroup, no process in rootfs.
func checkNothingLeft(t *testing.T, d *Driver, e env, id, rootfs string) {
	t.Helper()
	if ids, err := d.List(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("List() = %v, %v; want empty", ids, err)
	}
	for _, p := range []string{filepath.Join(d.stateDir, id), d.dir(id)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
	if dirs := testutil.CgroupDirs(t, e.cgroupParent); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if pids := testutil.ProcessesWithRoot(t, rootfs); len(pids) != 0 {
		t.Errorf("processes left in %s: %v", rootfs, pids)
	}
	if m := testutil.Mounts(t, d.cfg.Root); len(m) != 0 {
		t.Errorf("mounts left under %s: %v", d.cfg.Root, m)
	}
}

func readCgroup(t *testing.T, controller, p, file string) int64 {
	t.Helper()
	v, err := ocirt.ReadInt(filepath.Join(ocirt.CgroupRoot, controller, p, file))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestUpdateAndLimits(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	if d.cgroupsV2 {
		t.Skip("checks v1 cgroup files")
	}
	ctx := t.Context()
	rootfs := testutil.BusyboxRootfs(t)
	id := "upd"
	if err := d.Create(ctx, driver.Spec{ID: id, RootFS: rootfs, Resources: driver.Resources{MemoryBytes: 64 << 20, MilliCPUs: 500, Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	cg := d.cgroupPath(id)
	check := func(mem, quota, pids int64) {
		t.Helper()
		if got := readCgroup(t, "memory", cg, "memory.limit_in_bytes"); got != mem {
			t.Errorf("memory.limit_in_bytes = %d, want %d", got, mem)
		}
		if d.host.SwapAccounting {
			if got := readCgroup(t, "memory", cg, "memory.memsw.limit_in_bytes"); got != mem {
				t.Errorf("memory.memsw.limit_in_bytes = %d, want %d", got, mem)
			}
		}
		if got := readCgroup(t, "cpu", cg, "cpu.cfs_quota_us"); got != quota {
			t.Errorf("cpu.cfs_quota_us = %d, want %d", got, quota)
		}
		b, err := os.ReadFile(filepath.Join(ocirt.CgroupRoot, "pids", cg, "pids.max"))
		if err != nil {
			t.Fatal(err)
		}
		want := "max"
		if pids > 0 {
			want = strconv.FormatInt(pids, 10)
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("pids.max = %s, want %s", got, want)
		}
	}
	check(64<<20, 50000, 100)
	if got := readCgroup(t, "memory", cg, "memory.swappiness"); got != 0 {
		t.Errorf("memory.swappiness = %d, want 0", got)
	}
	if err := d.Update(ctx, id, driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 2000, Pids: 200}); err != nil {
		t.Fatal(err)
	}
	check(128<<20, 200000, 200)
}

// TestUpdateAllOrNothing makes the kernel refuse the second limit of an
// update (a CPU quota under its 1 ms minimum) after the first (memory) was
// set, and checks that the container keeps every limit it had, on v1 and
// v2.
func TestUpdateAllOrNothing(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	id := "half"
	before := driver.Resources{MemoryBytes: 64 << 20, MilliCPUs: 500, Pids: 100}
	if err := d.Create(ctx, driver.Spec{ID: id, RootFS: testutil.BusyboxRootfs(t), Resources: before}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	want := cgroupLimits(t, d.cgroup(id), d.host.SwapAccounting)
	if want["memory"] != strconv.Itoa(64<<20) {
		t.Fatalf("limits after create: %v", want)
	}
	err := d.Update(ctx, id, driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 1, Pids: 200})
	if err == nil {
		t.Fatal("Update with a CPU quota of 100 µs per 100 ms succeeded")
	}
	if got := cgroupLimits(t, d.cgroup(id), d.host.SwapAccounting); !maps.Equal(got, want) {
		t.Errorf("limits after a refused update = %v, want %v (%v)", got, want, err)
	}
	if err := d.Update(ctx, id, driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 1000, Pids: 200}); err != nil {
		t.Fatalf("Update after a refused one: %v", err)
	}
	if got := cgroupLimits(t, d.cgroup(id), d.host.SwapAccounting); got["memory"] != strconv.Itoa(128<<20) || got["pids"] != "200" {
		t.Errorf("limits after an update = %v", got)
	}
}

// cgroupLimits reads the limit files of cg that Update sets, v1 or v2.
func cgroupLimits(t *testing.T, cg ocirt.Cgroup, swap bool) map[string]string {
	t.Helper()
	read := func(controller, file string) string {
		b, err := os.ReadFile(filepath.Join(cg.Dir(controller), file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if cg.V2 {
		return map[string]string{"memory": read("", "memory.max"), "cpu": read("", "cpu.max"), "pids": read("", "pids.max")}
	}
	l := map[string]string{
		"memory": read("memory", "memory.limit_in_bytes"),
		"cpu":    read("cpu", "cpu.cfs_quota_us") + " " + read("cpu", "cpu.cfs_period_us"),
		"pids":   read("pids", "pids.max"),
	}
	if swap {
		l["memsw"] = read("memory", "memory.memsw.limit_in_bytes")
	}
	return l
}

// TestTakeOver checks that a second driver on the same root (a restarted
// daemon) sees, uses and deletes the first one's sandbox, and that a
// half-made sandbox directory is listed and deleted.
func TestTakeOver(t *testing.T) {
	e := newEnv(t)
	d1 := e.newDriver(t, nil)
	ctx := t.Context()
	rootfs := testutil.BusyboxRootfs(t)
	if err := d1.Create(ctx, driver.Spec{ID: "keep", RootFS: rootfs}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d1.dir("half"), 0o700); err != nil {
		t.Fatal(err)
	}
	d2, err := New(d1.cfg)
	if err != nil {
		t.Fatal(err)
	}
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
	c, err := d2.DialAgent(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, id := range ids {
		if err := d2.Delete(ctx, id); err != nil {
			t.Fatalf("Delete(%s): %v", id, err)
		}
	}
	checkNothingLeft(t, d2, e, "keep", rootfs)
}

// TestStoppedSandbox checks a sandbox whose init died: stopped, and
// deletable.
func TestStoppedSandbox(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	rootfs := testutil.BusyboxRootfs(t)
	if err := d.Create(ctx, driver.Spec{ID: "dies", RootFS: rootfs}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.cli.Run(ctx, nil, "kill", "dies", "KILL"); err != nil {
		t.Fatal(err)
	}
	drivertest.WaitStatus(t, d, "dies", driver.StatusStopped, 5*time.Second)
	if err := d.Delete(ctx, "dies"); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, d, e, "dies", rootfs)
}

// BenchmarkCreateDelete measures Create (bundle to agent ready), the first
// exec through the agent, and Delete, each as its own metric, without and
// with user namespaces.
func BenchmarkCreateDelete(b *testing.B) {
	e := newEnv(b)
	for _, userns := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", userns), func(b *testing.B) {
			d := e.newDriver(b, func(c *Config) {
				c.UserNamespaces = userns
				if os.Getenv("CORRAL_BENCH_LOG") != "" {
					c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
				}
			})
			benchCreateDelete(b, d)
		})
	}
}

func benchCreateDelete(b *testing.B, d *Driver) {
	rootfs := testutil.BusyboxRootfs(b)
	if err := d.PrepareTemplate(rootfs); err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	var create, first, del time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: rootfs, Resources: driver.Resources{MemoryBytes: 256 << 20, Pids: 256}}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if out, err := execOnce(ctx, d, id, "echo hi"); err != nil || out != "hi\n" {
			b.Fatalf("exec: %q, %v", out, err)
		}
		t2 := time.Now()
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		create += t1.Sub(t0)
		first += t2.Sub(t1)
		del += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(create.Microseconds())/1000/n, "create-ms/op")
	b.ReportMetric(float64((create+first).Microseconds())/1000/n, "create+exec-ms/op")
	b.ReportMetric(float64(del.Microseconds())/1000/n, "delete-ms/op")
}

// BenchmarkBareRuncRun is the reference for Create: a foreground
// `runc run` of the same busybox rootfs, with the same namespaces and
// cgroup limits, running `echo hi` with its output captured.
func BenchmarkBareRuncRun(b *testing.B) {
	e := newEnv(b)
	d := e.newDriver(b, nil)
	rootfs := testutil.BusyboxRootfs(b)
	bundle := b.TempDir()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		bareRun(b, d, bundle, rootfs, fmt.Sprintf("bare-%d", i))
	}
}

func bareRun(b *testing.B, d *Driver, bundle, rootfs, id string) {
	spec := OCISpec(driver.Spec{ID: id, RootFS: rootfs, Resources: driver.Resources{MemoryBytes: 256 << 20, Pids: 256}}, d.host, UserNS{})
	spec.Process.Args = []string{"/bin/echo", "hi"}
	if err := writeJSON(filepath.Join(bundle, configFile), spec); err != nil {
		b.Fatal(err)
	}
	cmd := exec.CommandContext(b.Context(), d.runcPath, "--root", d.stateDir, "run", "--bundle", bundle, id)
	out, err := cmd.Output()
	if err != nil || string(out) != "hi\n" {
		b.Fatalf("runc run: %q, %v", out, err)
	}
}

// BenchmarkColdCreateRatio alternates a cold Create plus first exec output
// with a bare `runc run` of the same rootfs, so that both see the same
// machine load, and reports their ratio (DESIGN.md's target: <= 1.3).
func BenchmarkColdCreateRatio(b *testing.B) {
	e := newEnv(b)
	d := e.newDriver(b, nil)
	rootfs := testutil.BusyboxRootfs(b)
	bareRootfs := testutil.BusyboxRootfs(b)
	bundle := b.TempDir()
	ctx := b.Context()
	var ours, bare time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("cold-%d", i)
		t0 := time.Now()
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: rootfs, Resources: driver.Resources{MemoryBytes: 256 << 20, Pids: 256}}); err != nil {
			b.Fatal(err)
		}
		if out, err := execOnce(ctx, d, id, "echo hi"); err != nil || out != "hi\n" {
			b.Fatalf("exec: %q, %v", out, err)
		}
		ours += time.Since(t0)
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		bareRun(b, d, bundle, bareRootfs, "bare-"+id)
		bare += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(ours.Microseconds())/1000/n, "create+exec-ms/op")
	b.ReportMetric(float64(bare.Microseconds())/1000/n, "bare-runc-ms/op")
	b.ReportMetric(float64(ours)/float64(bare), "ratio")
}
