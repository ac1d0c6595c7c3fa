package vm

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
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

// TestNetworkModeNone: a prepared namespace with loopback only (network
// mode none) gives a guest with loopback only.
func TestNetworkModeNone(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	ns := testutil.NewNetNS(t, t.TempDir())
	err := d.Create(ctx, driver.Spec{ID: "none", RootFS: testutil.BusyboxRootfs(t), Network: &driver.Network{NetNSPath: ns}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.WithoutCancel(ctx), "none")
	if out, err := drivertest.ExecOnce(ctx, d, "none", "ls /sys/class/net"); err != nil || out != "lo\n" {
		t.Errorf("interfaces in the guest = %q, %v; want lo alone", out, err)
	}
}

// TestNetworkLink: the guest takes over the address of the sandbox's end
// of a veth pair and reaches a server on the other end, as the daemon's
// network package sets them up (here the other end is in a namespace of
// the test's, not the host's); the guest gets the name service files of
// driver.Network (its Env is the Manager's to add to every exec).
func TestNetworkLink(t *testing.T) {
	e := newEnv(t)
	testutil.RequiresBinary(t, "ip")
	testutil.RequiresBinary(t, "nsenter")
	d := e.newDriver(t, nil)
	ctx := t.Context()
	dir := t.TempDir()
	sbNS := testutil.NewNetNS(t, t.TempDir())
	peerNS := testutil.NewNetNS(t, t.TempDir())
	for _, c := range []struct{ ns, cmd string }{
		{sbNS, "ip link add eth0 type veth peer name peer0"},
		{sbNS, "ip link set peer0 netns " + peerNS},
		{sbNS, "ip addr add 10.99.0.2/30 dev eth0"},
		{sbNS, "ip link set eth0 up"},
		{sbNS, "ip route add default via 10.99.0.1"},
		{peerNS, "ip addr add 10.99.0.1/30 dev peer0"},
		{peerNS, "ip link set peer0 up"},
	} {
		args := append([]string{"--net=" + c.ns}, strings.Fields(c.cmd)...)
		if out, err := exec.Command("nsenter", args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c.cmd, err, out)
		}
	}
	var ln net.Listener
	if err := ocirt.InNetNS(peerNS, func() (err error) {
		ln, err = net.Listen("tcp", "10.99.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong") })}
	go srv.Serve(ln)
	defer srv.Close()
	resolv, hosts := filepath.Join(dir, "resolv.conf"), filepath.Join(dir, "hosts")
	os.WriteFile(resolv, []byte("nameserver 10.99.0.1\n"), 0o644)
	os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n"), 0o644)
	n := &driver.Network{NetNSPath: sbNS, ResolvConf: resolv, Hosts: hosts}
	if err := d.Create(ctx, driver.Spec{ID: "linked", RootFS: testutil.BusyboxRootfs(t), Network: n}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.WithoutCancel(ctx), "linked")
	url := "http://" + ln.Addr().String() + "/"
	for script, want := range map[string]string{
		"wget -q -O - " + url:                        "pong",
		"cat /etc/resolv.conf":                       "nameserver 10.99.0.1\n",
		"ip -4 -o addr show eth0 | awk '{print $4}'": "10.99.0.2/30\n",
	} {
		if out, err := drivertest.ExecOnce(ctx, d, "linked", script); err != nil || out != want {
			t.Errorf("%s: %q, %v; want %q", script, out, err, want)
		}
	}
}

// TestFindKernel checks the modules found for the installed guest kernel:
// each after what it depends on.
func TestFindKernel(t *testing.T) {
	k, err := FindKernel(DefaultKernelDir)
	if err != nil {
		if testutil.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	var names []string
	for _, m := range k.Modules {
		names = append(names, strings.TrimSuffix(filepath.Base(m), ".ko"))
	}
	pos := func(name string) int { return slices.Index(names, name) }
	for _, want := range [][2]string{{"virtio_ring", "virtio_mmio"}, {"virtio", "virtio_blk"}, {"virtio", "virtio_console"}} {
		if pos(want[0]) < 0 || pos(want[0]) > pos(want[1]) {
			t.Errorf("modules %v: want %s before %s", names, want[0], want[1])
		}
	}
}

// TestTemplateImage: sandboxes of one template share one cached image of
// it, which outlives them; each has its own writable layer on it.
func TestTemplateImage(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	tmpl := testutil.BusyboxRootfs(t)
	for _, id := range []string{"t1", "t2"} {
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: testutil.BusyboxRootfs(t), Template: tmpl}); err != nil {
			t.Fatal(err)
		}
		defer d.Delete(context.WithoutCancel(ctx), id)
	}
	if _, err := drivertest.ExecOnce(ctx, d, "t1", "echo one > /mine"); err != nil {
		t.Fatal(err)
	}
	if out, _ := drivertest.ExecOnce(ctx, d, "t2", "cat /mine 2>&1"); !strings.Contains(out, "No such file") {
		t.Errorf("t2 sees t1's file: %q", out)
	}
	images, _ := filepath.Glob(filepath.Join(d.cacheDir(), "template-*.img"))
	if len(images) != 1 {
		t.Fatalf("template images %v, want one", images)
	}
	for _, id := range []string{"t1", "t2"} {
		if _, err := os.Stat(filepath.Join(d.dir(id), baseImage)); !os.IsNotExist(err) {
			t.Errorf("%s has an image of its own: %v", id, err)
		}
		if err := d.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(images[0]); err != nil {
		t.Errorf("template image gone with its sandboxes: %v", err)
	}
}

// TestTakeOver: a second driver on the same root (a restarted daemon)
// takes over the first one's running VM, whose agent reconnects to it, and
// deletes it without leaving anything behind.
func TestTakeOver(t *testing.T) {
	e := newEnv(t)
	d1 := e.newDriver(t, nil)
	ctx := t.Context()
	if err := d1.Create(ctx, driver.Spec{ID: "keep", RootFS: testutil.BusyboxRootfs(t)}); err != nil {
		t.Fatal(err)
	}
	d1.Close()
	d2, err := New(d1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if st, err := d2.Status(ctx, "keep"); err != nil || st != driver.StatusRunning {
		t.Fatalf("Status after takeover = %s, %v; want running", st, err)
	}
	if out, err := drivertest.ExecOnce(ctx, d2, "keep", "echo again"); err != nil || out != "again\n" {
		t.Fatalf("exec after takeover = %q, %v", out, err)
	}
	if err := d2.Delete(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	if st, _ := d2.Status(ctx, "keep"); st != driver.StatusUnknown {
		t.Errorf("Status after Delete = %s", st)
	}
	checkNothingLeft(t, d2, "keep")
	if dirs := testutil.CgroupDirs(t, e.cgroupParent); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
}

// TestStatsPaused: Stats of a paused VM answers at once, from the host
// cgroup alone, since nothing in the guest runs.
func TestStatsPaused(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "paused", RootFS: testutil.BusyboxRootfs(t)}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.WithoutCancel(ctx), "paused")
	if err := d.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	st, err := d.Stats(ctx, "paused")
	if err != nil || st.MemoryBytes <= 0 || time.Since(t0) > time.Second {
		t.Errorf("Stats of a paused VM = %+v, %v after %v", st, err, time.Since(t0))
	}
	if err := d.Resume(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Stats(ctx, "paused"); err != nil || st.Pids < 1 {
		t.Errorf("Stats after resume = %+v, %v; want the guest's tasks", st, err)
	}
}

func TestAgentError(t *testing.T) {
	dir := t.TempDir()
	console := "[    1.0] Run /agent as init process\n" +
		"time=2026-12-05T08:00:00Z level=ERROR msg=\"booting the VM\" error=\"mounting /dev/vda on /newroot: invalid argument\"\n" +
		"[    1.2] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\n"
	if err := os.WriteFile(filepath.Join(dir, consoleFile), []byte(console), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := agentError(dir); !strings.Contains(got, "mounting /dev/vda") {
		t.Errorf("agentError = %q", got)
	}
	if got := agentError(t.TempDir()); got != "" {
		t.Errorf("agentError without a console = %q", got)
	}
}

// TestGuestPanic: a guest kernel that panics ends its QEMU; the instance
// is reported stopped, its console shows why, and Delete leaves nothing.
func TestGuestPanic(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, nil)
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "panic", RootFS: testutil.BusyboxRootfs(t)}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.WithoutCancel(ctx), "panic")
	// The exec dies with the kernel; its error is expected.
	out, err := drivertest.ExecOnce(ctx, d, "panic", "echo c > /proc/sysrq-trigger")
	t.Logf("exec that panics the guest: %q, %v", out, err)
	drivertest.WaitStatus(t, d, "panic", driver.StatusStopped, 30*time.Second)
	if b, _ := os.ReadFile(filepath.Join(d.dir("panic"), consoleFile)); !strings.Contains(string(b), "Kernel panic") {
		t.Errorf("console lacks the panic:\n%s", b)
	}
	if err := d.Delete(ctx, "panic"); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, d, "panic")
	if dirs := testutil.CgroupDirs(t, e.cgroupParent); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
}
