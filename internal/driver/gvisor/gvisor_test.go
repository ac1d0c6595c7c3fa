package gvisor

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/testutil"
)

func TestMain(m *testing.M) { testutil.SubreaperMain(m) }

// env is what the gVisor tests share: a cgroup parent unique to the test
// (removed at its end) and the agent binary.
type env struct {
	cgroupParent string
	agent        string
}

func newEnv(t testing.TB) env {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runsc")
	return env{cgroupParent: testutil.CgroupParent(t), agent: testutil.AgentBinary(t)}
}

// newDriver returns a driver with its own short root (unix socket paths
// are limited to 107 bytes) and its own running reaper.
func (e env) newDriver(t testing.TB, mod func(*Config)) *Driver {
	t.Helper()
	root, rp := testutil.DriverDeps(t)
	cfg := Config{Root: root, AgentPath: e.agent, CgroupParent: e.cgroupParent, Reaper: rp}
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

// rootfs returns a busybox root with the mount points the driver's
// PrepareTemplate makes in templates.
func (e env) rootfs(t testing.TB) string {
	t.Helper()
	r := testutil.BusyboxRootfs(t)
	if err := ocirt.MakeMountPoints(r, []string{runc.AgentDest}, []string{RunDest}); err != nil {
		t.Fatal(err)
	}
	return r
}

// shiftedRootfs returns a busybox root prepared as the daemon prepares
// templates by default: by the runc driver with user namespaces (owners
// shifted into the sandbox ID range) and by this one.
func (e env) shiftedRootfs(t testing.TB) string {
	t.Helper()
	testutil.RequiresBinary(t, "runc")
	r := e.rootfs(t)
	rd, err := runc.New(runc.Config{Root: t.TempDir(), AgentPath: e.agent, UserNamespaces: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := rd.PrepareTemplate(r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	for _, shifted := range []bool{true, false} {
		t.Run(fmt.Sprintf("shifted=%v", shifted), func(t *testing.T) {
			drivertest.Run(t, drivertest.Harness{
				New: func(t *testing.T) driver.Driver { return e.newDriver(t, nil) },
				RootFS: func(t *testing.T) string {
					if shifted {
						return e.shiftedRootfs(t)
					}
					return e.rootfs(t)
				},
				CopyRootFS:   func(t *testing.T, src string) string { return copyTree(t, src) },
				CgroupParent: e.cgroupParent,
				Features: drivertest.Features{Limits: true, ProcessIsolation: true, Freeze: true,
					OOMKillsInstance: true, PidsOvershoot: 48, Mounts: true},
				NewWithAgent: func(t *testing.T, agent string, f drivertest.StartFailure) driver.Driver {
					return e.newDriver(t, func(c *Config) {
						c.AgentPath = agent
						if f.Timeout > 0 {
							c.StartTimeout = f.Timeout
						}
						if f.BreakRuntime {
							c.Platform = "nope"
						}
					})
				},
				StartFailures: startFailures,
				ErrorPrefix:   "creating sandbox ",
				NothingLeft: func(t *testing.T, d driver.Driver, _, _ string) {
					checkNothingLeft(t, d.(*Driver), e)
				},
			})
		})
	}
}

// copyTree copies the tree at src with cp -a, as storage copies a root.
func copyTree(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copying %s: %v\n%s", src, err, out)
	}
	return dst
}
