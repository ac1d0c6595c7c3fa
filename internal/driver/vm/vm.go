package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentdialout"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/subreaper"
	"github.com/corralrun/corral/internal/vmguest"
)

var (
	_ driver.Driver     = (*Driver)(nil)
	_ driver.Pauser     = (*Driver)(nil)
	_ driver.OOMCounter = (*Driver)(nil)
)

// Defaults of Config fields left zero.
const (
	DefaultKernelDir     = "/usr/local/lib/corral/vm-kernel"
	DefaultCgroupParent  = "/corral"
	DefaultStartTimeout  = 60 * time.Second
	DefaultMemory        = 512 << 20
	DefaultGuestOverhead = 160 << 20
	DefaultHostOverhead  = 192 << 20
	DefaultDiskBytes     = 2 << 30
	DefaultHostPids      = 512
)

// Files in a sandbox directory.
const (
	baseImage   = "root.img"
	diskFile    = "disk.qcow2"
	agentSocket = "agent.sock"
	qmpSocket   = "qmp.sock"
	consoleFile = "console.log"
	pidFile     = "qemu.pid"
)

// Config configures a Driver.
type Config struct {
	// Root holds one directory per sandbox, Root/sandboxes/<id>, with its
	// disks and sockets, and the driver's cache, Root/cache (initramfs
	// images). It must be an absolute path short enough for
	// Root/sandboxes/<id>/agent.sock to fit a unix socket address, on a
	// file system with room for the sandboxes' disks.
	Root string
	// QEMUPath is qemu-system-x86_64, and QEMUImgPath qemu-img; from PATH
	// when empty.
	QEMUPath, QEMUImgPath string
	// KernelDir is a Debian linux-image package unpacked with
	// `dpkg-deb -x`; DefaultKernelDir when empty.
	KernelDir string
	// AgentPath is the static agent binary, the guest's init.
	AgentPath string
	// CgroupParent is the host cgroup under which each sandbox's QEMU
	// process gets <CgroupParent>/<id>; DefaultCgroupParent when empty.
	CgroupParent string
	// Accel is QEMU's accelerator, "kvm" or "tcg"; when empty, kvm where
	// /dev/kvm opens, tcg elsewhere.
	Accel string
	// Reaper, when set, reaps the QEMU processes; without one the driver
	// waits for them itself.
	Reaper *subreaper.Reaper
	// StartTimeout bounds Create; DefaultStartTimeout when zero.
	StartTimeout time.Duration
	// DefaultMemory is the memory limit of a sandbox that asks for none.
	DefaultMemory int64
	// GuestOverhead is added to a sandbox's memory limit to size its VM:
	// the guest kernel, the initramfs and the agent live outside the
	// limit. HostOverhead is added again for the QEMU process in the
	// host cgroup.
	GuestOverhead, HostOverhead int64
	// DiskBytes is the size of a sandbox's root disk.
	DiskBytes int64
	// HostPids is the pids limit of the QEMU process's cgroup.
	HostPids int64
	// Logger receives lifecycle logs; nil discards them.
	Logger *slog.Logger
}

// Driver runs sandboxes in QEMU microVMs. Everything about a sandbox
// lives in its directory and its QEMU process, so a new Driver on the same
// Root takes over the VMs of one that went away (New). Methods are safe
// for concurrent use on different IDs; the caller serializes calls for
// the same ID.
type Driver struct {
	cfg       Config
	qemu, img string
	kernel    Kernel
	initrd    string
	accel     string
	tscKHz    int64 // the guest's TSC frequency under TCG, 0 if unknown
	hostCPUs  int
	cgroupsV2 bool
	swap      bool
	log       *slog.Logger

	mu  sync.Mutex
	vms map[string]*instance
}

// instance is one running QEMU process and the driver's handles on it.
type instance struct {
	pid    int
	exited <-chan struct{} // closed once QEMU has exited and been reaped
	agent  *agentdialout.Listener
	qmp    *qmp
	// stop, for a VM taken over from an earlier driver, ends the
	// goroutine that watches its QEMU; nil for one this driver started.
	stop chan struct{}
}

// New checks cfg, finds QEMU and the guest kernel, and builds the
// initramfs (once per kernel and agent binary). The error wraps
// errdefs.ErrFailedPrecondition when something the runtime needs is
// missing, and says how to install it.
func New(cfg Config) (*Driver, error) {
	if !filepath.IsAbs(cfg.Root) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "driver root %q is not an absolute path", cfg.Root)
	}
	cfg = withDefaults(cfg)
	d := &Driver{cfg: cfg, log: cfg.Logger, vms: map[string]*instance{}, hostCPUs: runtime.NumCPU()}
	var err error
	if d.qemu, err = lookPath(cfg.QEMUPath, "qemu-system-x86_64", "qemu-system-x86"); err != nil {
		return nil, err
	}
	if d.img, err = lookPath(cfg.QEMUImgPath, "qemu-img", "qemu-utils"); err != nil {
		return nil, err
	}
	if _, err := lookPath("", "mkfs.ext4", "e2fsprogs"); err != nil {
		return nil, err
	}
	if d.kernel, err = FindKernel(cfg.KernelDir); err != nil {
		return nil, err
	}
	if d.accel = cfg.Accel; d.accel == "" {
		d.accel = "tcg"
		if KVMUsable() == nil {
			d.accel = "kvm"
		}
	}
	if d.accel == "tcg" {
		d.tscKHz = hostTSCkHz()
	}
	if d.cgroupsV2, d.swap, err = ocirt.DetectCgroups(); err != nil {
		return nil, err
	}
	for _, dir := range []string{d.sandboxesDir(), d.cacheDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating vm driver directory: %w", err)
		}
	}
	if d.initrd, err = initramfs(d.cacheDir(), d.kernel, cfg.AgentPath); err != nil {
		return nil, err
	}
	if err := d.adoptAll(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// adoptAll takes over the VMs of an earlier driver on the same Root (a
// daemon that restarted): for every sandbox directory whose QEMU still
// runs, it listens on the agent's socket again, which QEMU reconnects to
// within a second, and connects to QMP. A directory without a running
// QEMU stays as it is: Status reports it stopped and Delete removes it.
func (d *Driver) adoptAll() error {
	ids, err := ocirt.ListDirs(d.sandboxesDir())
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, id := range ids {
		dir := d.dir(id)
		pid, err := ocirt.ReadPid(filepath.Join(dir, pidFile))
		if err != nil || pid <= 0 || !isQEMU(pid, dir) {
			continue
		}
		l, err := agentdialout.Listen(filepath.Join(dir, agentSocket), d.log)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		q, err := dialQMP(ctx, filepath.Join(dir, qmpSocket))
		cancel()
		if err != nil {
			l.Close()
			d.log.Warn("not taking over a VM", "sandbox_id", id, "error", err)
			continue
		}
		vm := &instance{pid: pid, agent: l, qmp: q, stop: make(chan struct{})}
		vm.exited = watchForeign(pid, dir, vm.stop)
		d.vms[id] = vm
		d.log.Info("took over VM", "sandbox_id", id, "pid", pid)
	}
	return nil
}

// watchForeign returns a channel closed once process pid, a QEMU of the
// sandbox directory dir that is not this process's child, is gone, or
// stop is closed. It polls: such a process cannot be waited for.
func watchForeign(pid int, dir string, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for isQEMU(pid, dir) && ocirt.ProcState(pid) != 'Z' {
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return done
}

func withDefaults(cfg Config) Config {
	if cfg.KernelDir == "" {
		cfg.KernelDir = DefaultKernelDir
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.DefaultMemory <= 0 {
		cfg.DefaultMemory = DefaultMemory
	}
	if cfg.GuestOverhead <= 0 {
		cfg.GuestOverhead = DefaultGuestOverhead
	}
	if cfg.HostOverhead <= 0 {
		cfg.HostOverhead = DefaultHostOverhead
	}
	if cfg.DiskBytes <= 0 {
		cfg.DiskBytes = DefaultDiskBytes
	}
	if cfg.HostPids <= 0 {
		cfg.HostPids = DefaultHostPids
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// lookPath finds a program (the configured path, else name on PATH);
// the error names the Debian package that has it.
func lookPath(configured, name, pkg string) (string, error) {
	if configured == "" {
		configured = name
	}
	p, err := exec.LookPath(configured)
	if err != nil {
		return "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s not found (apt-get install %s): %v", name, pkg, err)
	}
	return p, nil
}

// KVMUsable returns nil when /dev/kvm can be opened for reading and
// writing, which is what QEMU's KVM accelerator needs, and otherwise why
// not.
func KVMUsable() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// hostTSCkHz returns the host CPU's frequency in kHz as /proc/cpuinfo
// gives it, or 0. Under TCG the guest reads the host's TSC, and a guest
// kernel that calibrates it against the emulated PIT fails when the host
// is busy and then hangs waiting for its first timer tick; given the
// frequency (tsc_early_khz) it skips the calibration. On the hosts
// without KVM (virtual machines) the reported frequency is the TSC's.
func hostTSCkHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || mhz <= 0 {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}

// Accel is the accelerator the driver's VMs run with: "kvm" or "tcg".
func (d *Driver) Accel() string { return d.accel }

func (d *Driver) sandboxesDir() string { return filepath.Join(d.cfg.Root, "sandboxes") }
func (d *Driver) cacheDir() string     { return filepath.Join(d.cfg.Root, "cache") }
func (d *Driver) dir(id string) string { return filepath.Join(d.sandboxesDir(), id) }
func (d *Driver) cgroup(id string) ocirt.Cgroup {
	return ocirt.Cgroup{V2: d.cgroupsV2, Path: path.Join(d.cfg.CgroupParent, id)}
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return "vm" }

// Capabilities implements driver.Driver.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Pause: true, Isolation: "vm", Accel: d.accel, PrivateDisk: true}
}

func (d *Driver) get(id string) *instance {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.vms[id]
}

// Status implements driver.Driver: stopped once QEMU has exited (the
// guest's init ended or the kernel panicked), otherwise QEMU's own run
// state.
func (d *Driver) Status(ctx context.Context, id string) (driver.Status, error) {
	vm := d.get(id)
	if vm == nil {
		if _, err := os.Stat(d.dir(id)); err == nil {
			return driver.StatusStopped, nil
		}
		return driver.StatusUnknown, nil
	}
	select {
	case <-vm.exited:
		return driver.StatusStopped, nil
	default:
	}
	st, err := vm.qmp.status(ctx)
	if err != nil {
		// QMP fails first when QEMU exits; its reaping follows shortly.
		select {
		case <-vm.exited:
			return driver.StatusStopped, nil
		case <-time.After(2 * time.Second):
		}
		return "", fmt.Errorf("reading status of %s: %w", id, err)
	}
	switch st {
	case "running":
		return driver.StatusRunning, nil
	case "paused":
		return driver.StatusPaused, nil
	case "shutdown", "guest-panicked", "internal-error":
		return driver.StatusStopped, nil
	}
	return driver.StatusUnknown, nil
}

// List implements driver.Driver: every sandbox directory, including those
// of half-made sandboxes.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return ocirt.ListDirs(d.sandboxesDir())
}

// DialAgent implements driver.Driver: a new yamux stream over the VM's
// virtio-serial port.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	vm := d.get(id)
	if vm == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "dialing agent of %s: no such sandbox", id)
	}
	return vm.agent.Dial(ctx)
}

// guestReadTimeout bounds Stats' and OOMKills' reads of guest files: a
// guest that does not answer must not hold up its caller.
const guestReadTimeout = 5 * time.Second

// Stats implements driver.Driver. Memory and CPU are the QEMU process's,
// read from its host cgroup (the VM's cost to the host); tasks and OOM
// kills are the guest's, read from its sandbox cgroup through the agent,
// except while the VM is paused, when nothing in it answers and they are
// reported as zero.
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	vm := d.get(id)
	if vm == nil {
		return driver.Stats{}, errdefs.Errorf(errdefs.ErrNotFound, "reading stats of %s: no such sandbox", id)
	}
	s, err := ocirt.InstanceStats(id, d.cgroup)
	if err != nil {
		return s, err
	}
	if st, err := vm.qmp.status(ctx); err != nil || st != "running" {
		return s, nil
	}
	ctx, cancel := context.WithTimeout(ctx, guestReadTimeout)
	defer cancel()
	c := d.agentClient(id)
	defer c.Close()
	if s.Pids, err = readGuestInt(ctx, c, vmguest.SandboxCgroup+"/pids.current", ""); err != nil {
		return s, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	if s.OOMKills, err = readGuestInt(ctx, c, vmguest.SandboxCgroup+"/memory.events", "oom_kill"); err != nil {
		return s, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	return s, nil
}

// OOMKills implements driver.OOMCounter with the guest's count.
func (d *Driver) OOMKills(ctx context.Context, id string) (int64, error) {
	if d.get(id) == nil {
		return 0, errdefs.Errorf(errdefs.ErrNotFound, "reading OOM kills of %s: no such sandbox", id)
	}
	ctx, cancel := context.WithTimeout(ctx, guestReadTimeout)
	defer cancel()
	c := d.agentClient(id)
	defer c.Close()
	n, err := readGuestInt(ctx, c, vmguest.SandboxCgroup+"/memory.events", "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("reading OOM kills of %s: %w", id, err)
	}
	return n, nil
}

func (d *Driver) agentClient(id string) *agentclient.Client {
	return agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
}

// readGuestInt reads a number from a guest file: the whole file, or the
// value of the "key N" line when key is set (0 when absent).
func readGuestInt(ctx context.Context, c *agentclient.Client, name, key string) (int64, error) {
	r, _, err := c.ReadFile(ctx, name)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", name, err)
	}
	text := string(b)
	if key != "" {
		text = "0"
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, key+" "); ok {
				text = v
			}
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", name, err)
	}
	return n, nil
}

// Pause implements driver.Pauser: QMP stop halts the vCPUs, so nothing in
// the guest runs until Resume.
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.setRunning(ctx, id, false)
}

// Resume implements driver.Pauser with QMP cont.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.setRunning(ctx, id, true)
}

func (d *Driver) setRunning(ctx context.Context, id string, run bool) error {
	verb, want, cmd := "pausing", "running", "stop"
	if run {
		verb, want, cmd = "resuming", "paused", "cont"
	}
	vm := d.get(id)
	if vm == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "%s %s: no such sandbox", verb, id)
	}
	st, err := vm.qmp.status(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, id, err)
	}
	if st != want {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s %s: the VM is %s", verb, id, st)
	}
	if err := vm.qmp.execute(ctx, cmd, nil); err != nil {
		return fmt.Errorf("%s %s: %w", verb, id, err)
	}
	return nil
}

// Delete implements driver.Driver: it kills QEMU (the guest's state is
// disposable; its disk goes too), waits for it, and removes the sockets,
// disks and cgroup.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("deleting %s: %w", id, err)
	}
	if err := d.destroy(ctx, id); err != nil {
		return fmt.Errorf("deleting %s: %w", id, err)
	}
	return nil
}

// destroy releases everything of sandbox id in any partial state.
func (d *Driver) destroy(ctx context.Context, id string) error {
	d.mu.Lock()
	vm := d.vms[id]
	delete(d.vms, id)
	d.mu.Unlock()
	var errs []error
	if vm != nil {
		if vm.qmp != nil {
			vm.qmp.close()
		}
		if vm.agent != nil {
			vm.agent.Close()
		}
		if vm.pid > 0 {
			_ = syscallKill(vm.pid)
			select {
			case <-vm.exited:
			case <-time.After(10 * time.Second):
				errs = append(errs, fmt.Errorf("QEMU (pid %d) did not exit", vm.pid))
			}
		}
		if vm.stop != nil {
			close(vm.stop)
		}
	} else if pid, err := ocirt.ReadPid(filepath.Join(d.dir(id), pidFile)); err == nil && pid > 0 {
		// A QEMU of an earlier driver: not this process's child.
		if isQEMU(pid, d.dir(id)) {
			_ = syscallKill(pid)
			ocirt.WaitGone(ctx, pid, 10*time.Second)
		}
	}
	cg := d.cgroup(id)
	cg.Kill()
	if err := cg.Remove(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.dir(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing sandbox directory: %w", err))
	}
	return errors.Join(errs...)
}

// isQEMU reports whether pid is a QEMU process of the sandbox directory
// dir (its command line names the directory), so that a recycled pid is
// never killed.
func isQEMU(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), dir+"/")
}

// Close implements driver.Driver: it closes the driver's sockets; QEMU
// processes keep running.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, vm := range d.vms {
		if vm.qmp != nil {
			vm.qmp.close()
		}
		vm.agent.Close()
		if vm.stop != nil {
			close(vm.stop)
			vm.stop = nil
		}
	}
	return nil
}
