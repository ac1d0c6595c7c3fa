package vm

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

func TestMain(m *testing.M) { testutil.SubreaperMain(m) }

// env is what the VM tests share: a cgroup parent unique to the test and
// the agent binary.
type env struct {
	cgroupParent string
	agent        string
}

// newEnv skips (or fails under CORRAL_TEST_REQUIRE=1) unless QEMU, qemu-img
// and a guest kernel are there. KVM is not required: without it the VMs
// run under TCG, slowly.
func newEnv(t testing.TB) env {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "qemu-system-x86_64")
	testutil.RequiresBinary(t, "qemu-img")
	testutil.RequiresBinary(t, "mkfs.ext4")
	if _, err := FindKernel(DefaultKernelDir); err != nil {
		if testutil.Required() {
			t.Fatalf("test needs a guest kernel: %v", err)
		}
		t.Skipf("test needs a guest kernel: %v", err)
	}
	return env{cgroupParent: testutil.CgroupParent(t), agent: testutil.AgentBinary(t)}
}

func (e env) newDriver(t testing.TB, mod func(*Config)) *Driver {
	t.Helper()
	root, rp := testutil.DriverDeps(t)
	cfg := Config{Root: root, AgentPath: e.agent, CgroupParent: e.cgroupParent, Reaper: rp,
		// Several VMs boot at once under emulation on two cores.
		StartTimeout: 2 * time.Minute}
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
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

// startFailures are the ways a VM's start can fail. The guest's init is
// the agent in the initramfs, so an agent that is no program panics the
// guest kernel, which ends QEMU (-no-reboot).
var startFailures = []drivertest.StartFailure{
	{Name: "init not executable", Agent: "", Want: "QEMU exited"},
	{Name: "init needs a shell the initramfs lacks", Agent: "exit 3", Want: "QEMU exited"},
	{Name: "timeout", Agent: "", Timeout: 300 * time.Millisecond, WantErr: context.DeadlineExceeded},
	{Name: "canceled", Agent: "", Cancel: 10 * time.Millisecond, WantErr: context.Canceled},
	{Name: "missing root", Agent: "", MissingRoot: true, Want: "no such file or directory", WantErr: errdefs.ErrInvalidArgument},
	{Name: "qemu fails", Agent: "", BreakRuntime: true, Want: "QEMU exited"},
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	drivertest.Run(t, drivertest.Harness{
		New:          func(t *testing.T) driver.Driver { return e.newDriver(t, nil) },
		RootFS:       func(t *testing.T) string { return testutil.BusyboxRootfs(t) },
		CgroupParent: e.cgroupParent,
		Features:     drivertest.Features{Limits: true, ProcessIsolation: true, Freeze: true, PidsOvershoot: 16},
		NewWithAgent: func(t *testing.T, agent string, f drivertest.StartFailure) driver.Driver {
			return e.newDriver(t, func(c *Config) {
				c.AgentPath = agent
				if f.Timeout > 0 {
					c.StartTimeout = f.Timeout
				}
				if f.BreakRuntime {
					c.QEMUPath = "false"
				}
			})
		},
		StartFailures: startFailures,
		ErrorPrefix:   "creating sandbox ",
		NothingLeft: func(t *testing.T, d driver.Driver, id, _ string) {
			checkNothingLeft(t, d.(*Driver), id)
		},
	})
}

// checkNothingLeft fails the test if sandbox id left its directory, or a
// QEMU process naming it, behind.
func checkNothingLeft(t *testing.T, d *Driver, id string) {
	t.Helper()
	if _, err := os.Stat(d.dir(id)); !os.IsNotExist(err) {
		t.Errorf("leak: sandbox directory of %s: %v", id, err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), d.dir(id)+"/") {
			t.Errorf("leak: QEMU process %s", p)
		}
	}
}
