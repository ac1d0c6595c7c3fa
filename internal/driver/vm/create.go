package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/agentdialout"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
	"github.com/corralrun/corral/internal/vmguest"
)

// Create builds the sandbox's disks, starts QEMU paused, moves it into
// its host cgroup, lets the VM run and returns once the guest's agent
// answers. It fails with ErrAlreadyExists when the ID is in use, with
// ErrNotImplemented for host mounts, and with ErrFailedPrecondition for a
// network namespace it cannot give the VM (see plugNetwork). On any
// failure it removes everything it made (the network namespace is the
// daemon's); the error carries the end of the VM's console.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (err error) {
	id := spec.ID
	dir := d.dir(id)
	if err := ocirt.MakeSandboxDir(id, spec.RootFS, dir, filepath.Join(dir, agentSocket)); err != nil {
		return fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	var u undo.Stack
	defer ocirt.UndoFailed(ctx, &u, &err, filepath.Join(dir, consoleFile), "creating sandbox "+id)
	u.Add(func(ctx context.Context) error { return d.destroy(ctx, id) })

	if len(spec.Mounts) > 0 {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "the vm runtime cannot mount host directories yet")
	}
	if fi, err := os.Stat(spec.RootFS); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "root file system: %v", errors.Unwrap(err))
	}
	if err := d.makeDisk(ctx, dir, spec); err != nil {
		return err
	}
	disked := time.Now()
	if err := d.makeCgroup(id, spec.Resources); err != nil {
		return err
	}
	guestNet, err := plugNetwork(spec.Network)
	if err != nil {
		return err
	}
	l, err := agentdialout.Listen(filepath.Join(dir, agentSocket), d.log)
	if err != nil {
		return err
	}
	vm := &instance{agent: l}
	d.mu.Lock()
	d.vms[id] = vm
	d.mu.Unlock()
	if err := d.startQEMU(ctx, id, spec, d.qemuArgs(id, spec, guestNet), vm); err != nil {
		return err
	}
	if spec.Started != nil {
		spec.Started()
	}
	booted := time.Now()
	if err := waitAgent(ctx, d, id, vm); err != nil {
		return err
	}
	if err := d.writeNameFiles(ctx, id, spec.Network); err != nil {
		return err
	}
	// The CPU quota only now: booting is the VM's own work, not the
	// sandbox's, and under emulation a quota would stretch it.
	l2 := d.hostLimits(spec.Resources)
	if _, err := d.cgroup(id).SetLimits(l2, d.swap); err != nil {
		return err
	}
	d.log.Debug("created sandbox", "sandbox_id", id, "driver", "vm", "accel", d.accel,
		"duration_ms", time.Since(began).Milliseconds(), "disk_ms", disked.Sub(began).Milliseconds(),
		"agent_ms", time.Since(booted).Milliseconds())
	return nil
}

// makeDisk builds the sandbox's disk in dir: a qcow2 overlay, which takes
// the VM's writes, on a read-only ext4 image of the root: the template's
// image, built once and shared, when spec names a template, or else one
// of the sandbox's own root tree.
func (d *Driver) makeDisk(ctx context.Context, dir string, spec driver.Spec) error {
	var base string
	if spec.Template != "" {
		var err error
		if base, err = d.templateImage(ctx, spec.Template); err != nil {
			return err
		}
	} else {
		base = filepath.Join(dir, baseImage)
		if err := d.makeImage(ctx, spec.RootFS, base); err != nil {
			return err
		}
	}
	if out, err := exec.CommandContext(ctx, d.img, "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw",
		filepath.Join(dir, diskFile)).CombinedOutput(); err != nil {
		return fmt.Errorf("making disk overlay: %w: %s", errors.Join(ctx.Err(), err), strings.TrimSpace(string(out)))
	}
	return nil
}

// templateImage returns the image of the template tree at tree, building
// it in the cache unless it is there. The name holds the tree's identity
// (device, inode, change time): a template made again under the same
// name is a new tree and gets a new image. Concurrent builds of one
// image are harmless: the first to finish is linked into place, the
// others are dropped, and a linked image never changes.
func (d *Driver) templateImage(ctx context.Context, tree string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(tree, &st); err != nil {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "template tree: %v", err)
	}
	key := fmt.Sprintf("%s\x00%d\x00%d\x00%d.%d", tree, st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	sum := sha256.Sum256([]byte(key))
	name := filepath.Join(d.cacheDir(), "template-"+hex.EncodeToString(sum[:12])+".img")
	if _, err := os.Stat(name); err == nil {
		return name, nil
	}
	tmp := filepath.Join(d.cacheDir(), fmt.Sprintf(".template-%x-%d.img", sum[:12], time.Now().UnixNano()))
	defer os.Remove(tmp)
	if err := d.makeImage(ctx, tree, tmp); err != nil {
		return "", err
	}
	if err := os.Link(tmp, name); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("caching template image: %w", err)
	}
	return name, nil
}

// makeImage writes a read-only ext4 image of the tree at src to the new
// file dst, sized Config.DiskBytes (sparse). mkfs.ext4 -d copies the tree
// with its owners and modes; the guest initializes the inode tables and
// the journal lazily, as on any new disk.
func (d *Driver) makeImage(ctx context.Context, src, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("creating root image: %w", err)
	}
	err = f.Truncate(d.cfg.DiskBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sizing root image: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1",
		"-d", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("making root image: %w: %s", errors.Join(ctx.Err(), err), strings.TrimSpace(string(out)))
	}
	if err := os.Chmod(dst, 0o400); err != nil {
		return fmt.Errorf("sealing root image: %w", err)
	}
	return nil
}

// memory returns the sandbox's memory limit and the VM's size for r.
func (d *Driver) memory(r driver.Resources) (limit, vm int64) {
	limit = r.MemoryBytes
	if limit <= 0 {
		limit = d.cfg.DefaultMemory
	}
	return limit, limit + d.cfg.GuestOverhead
}

// cpus is the VM's vCPU count: the CPU limit rounded up, at most host,
// the host's CPUs.
func cpus(r driver.Resources, host int) int {
	n := int((r.MilliCPUs + 999) / 1000)
	return max(1, min(n, host))
}

// hostLimits are the limits of the QEMU process's host cgroup.
func (d *Driver) hostLimits(r driver.Resources) ocirt.Limits {
	_, vm := d.memory(r)
	l := ocirt.LimitsOf(r)
	l.MemoryBytes = vm + d.cfg.HostOverhead
	l.Pids = d.cfg.HostPids
	return l
}

// makeCgroup creates the host cgroup for QEMU with the memory and pids
// limits; the CPU quota comes after the boot.
func (d *Driver) makeCgroup(id string, r driver.Resources) error {
	cg := d.cgroup(id)
	if cg.V2 {
		if err := os.MkdirAll(cg.Dir(""), 0o755); err != nil {
			return fmt.Errorf("creating cgroup: %w", err)
		}
	} else {
		for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "freezer"} {
			if err := os.MkdirAll(cg.Dir(c), 0o755); err != nil {
				return fmt.Errorf("creating cgroup: %w", err)
			}
		}
		if err := os.WriteFile(filepath.Join(cg.Dir("memory"), "memory.swappiness"), []byte("0"), 0); err != nil {
			return fmt.Errorf("creating cgroup: %w", err)
		}
	}
	boot := d.hostLimits(r)
	boot.CPUQuota = 0
	_, err := cg.SetLimits(boot, d.swap)
	return err
}

// join moves process pid, all its threads, into the sandbox's host
// cgroup in every hierarchy.
func (d *Driver) join(id string, pid int) error {
	cg := d.cgroup(id)
	dirs := []string{cg.Dir("")}
	if !cg.V2 {
		dirs = nil
		for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "freezer"} {
			dirs = append(dirs, cg.Dir(c))
		}
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving QEMU into cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// qemuArgs is the command line of sandbox id's QEMU: a microvm machine
// (no PCI, no firmware tables beyond ACPI) started paused (-S), whose
// devices are the root disk, the agent's serial port and, with a
// network, a NIC on the tap device in the sandbox's namespace, all virtio
// over MMIO. Under TCG the machine needs its legacy PIT and PIC, or the guest
// hangs in timer calibration.
func (d *Driver) qemuArgs(id string, spec driver.Spec, guestNet *vmguest.Network) []string {
	dir := d.dir(id)
	limit, mem := d.memory(spec.Resources)
	accel := "kvm"
	cpu := "host"
	if d.accel != "kvm" {
		// A bounded translation cache: the default is 1 GiB per VM.
		accel, cpu = "tcg,tb-size=64", "max"
	}
	agent := []string{"agent", "--vm", "--dial=" + vmguest.PortPath, "--memory=" + strconv.FormatInt(limit, 10)}
	if spec.Hostname != "" {
		agent = append(agent, "--hostname="+spec.Hostname)
	}
	if spec.Resources.Pids > 0 {
		agent = append(agent, "--pids="+strconv.FormatInt(spec.Resources.Pids, 10))
	}
	if guestNet != nil {
		agent = append(agent, "--net="+guestNet.String())
	}
	// A panicking guest resets at once, by a triple fault (reboot=t),
	// which -no-reboot turns into QEMU's exit: the microvm machine has no
	// ACPI or keyboard-controller reset for the kernel's default methods
	// to use, and it would spin trying them.
	kernel := "console=ttyS0 quiet panic=-1 reboot=t"
	if d.tscKHz > 0 {
		kernel += " tsc_early_khz=" + strconv.FormatInt(d.tscKHz, 10)
	}
	cmdline := kernel + " rdinit=" + vmguest.AgentPath + " -- " + strings.Join(agent, " ")
	var nic []string
	if guestNet != nil {
		nic = []string{
			"-netdev", "tap,id=net0,ifname=" + tapDevice + ",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net0,mac=" + guestMAC(id),
		}
	}
	return append([]string{
		"-name", "corral-" + id,
		"-machine", "microvm,pit=on,pic=on,rtc=on",
		"-accel", accel, "-cpu", cpu,
		"-m", strconv.FormatInt(mem>>20, 10) + "M",
		"-smp", strconv.Itoa(cpus(spec.Resources, d.hostCPUs)),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-S",
		"-chardev", "file,id=console,path=" + filepath.Join(dir, consoleFile),
		"-serial", "chardev:console",
		"-kernel", d.kernel.Image, "-initrd", d.initrd, "-append", cmdline,
		"-drive", "id=root,file=" + filepath.Join(dir, diskFile) + ",format=qcow2,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + filepath.Join(dir, agentSocket) + ",reconnect=1",
		"-device", "virtserialport,chardev=agent,name=" + vmguest.PortName,
		"-qmp", "unix:" + filepath.Join(dir, qmpSocket) + ",server=on,wait=off",
		"-pidfile", filepath.Join(dir, pidFile),
	}, nic...)
}

// startQEMU starts QEMU paused, moves it into the host cgroup and lets
// the VM run. QEMU's own messages go to the console log.
func (d *Driver) startQEMU(ctx context.Context, id string, spec driver.Spec, args []string, vm *instance) error {
	dir := d.dir(id)
	logf, err := os.OpenFile(filepath.Join(dir, consoleFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(d.qemu, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: signals for the daemon's process group are
	// not QEMU's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// In the sandbox's network namespace, where its tap device is: the
	// process inherits the namespace of the thread that starts it.
	start := cmd.Start
	if spec.Network != nil {
		start = func() error { return ocirt.InNetNS(spec.Network.NetNSPath, cmd.Start) }
	}
	if err := start(); err != nil {
		return fmt.Errorf("starting QEMU: %w", err)
	}
	vm.pid = cmd.Process.Pid
	vm.exited = d.watch(cmd)
	if err := d.join(id, vm.pid); err != nil {
		// A QEMU that exits at once (bad arguments) is gone before it
		// can be moved; its reaping follows shortly.
		if errors.Is(err, syscall.ESRCH) {
			select {
			case <-vm.exited:
				return errors.New("QEMU exited")
			case <-time.After(5 * time.Second):
			}
		}
		return err
	}
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-vm.exited:
			cancel()
		case <-qctx.Done():
		}
	}()
	q, err := dialQMP(qctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return exitedErr(vm, err)
	}
	vm.qmp = q
	if err := q.execute(qctx, "cont", nil); err != nil {
		return exitedErr(vm, err)
	}
	return nil
}

// exitedErr is err, or a plainer error when QEMU has exited (its reason
// is in the console log, which the caller appends).
func exitedErr(vm *instance, err error) error {
	select {
	case <-vm.exited:
		return errors.New("QEMU exited")
	default:
		return err
	}
}

// agentError returns the last error the agent logged on the VM's console
// at dir, or "": when the agent, the guest's init, fails, the kernel's
// panic report follows its message and pushes it out of the console's
// tail that errors carry.
func agentError(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, consoleFile))
	if err != nil {
		return ""
	}
	last := ""
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "flag provided but not defined") {
			last = strings.TrimSpace(line)
		}
	}
	return last
}

// watch returns a channel closed once cmd's process has exited and been
// reaped, by the Reaper when there is one.
func (d *Driver) watch(cmd *exec.Cmd) <-chan struct{} {
	done := make(chan struct{})
	if d.cfg.Reaper != nil {
		ch := d.cfg.Reaper.Watch(cmd.Process.Pid)
		go func() {
			<-ch
			close(done)
		}()
		return done
	}
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return done
}

// waitAgent waits until the agent in the VM answers a health request,
// QEMU exits, or ctx ends. The request waits in the socket until the
// guest opens its port; a failure (a session dropped while the guest
// booted) is retried.
func waitAgent(ctx context.Context, d *Driver, id string, vm *instance) error {
	c := d.agentClient(id)
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-vm.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		_, err := c.Health(ctx)
		if err == nil {
			return nil
		}
		// An exit cancels ctx too; it is the reason then.
		select {
		case <-vm.exited:
			return d.exitedEarly(id)
		default:
		}
		select {
		case <-vm.exited:
			return d.exitedEarly(id)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the agent: %w", context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeNameFiles copies the sandbox's resolv.conf and hosts, which other
// runtimes bind-mount, into the guest's /etc through the agent.
func (d *Driver) writeNameFiles(ctx context.Context, id string, n *driver.Network) error {
	if n == nil {
		return nil
	}
	c := d.agentClient(id)
	defer c.Close()
	for src, dst := range map[string]string{n.ResolvConf: "/etc/resolv.conf", n.Hosts: "/etc/hosts"} {
		if src == "" {
			continue
		}
		f, err := os.Open(src)
		if err != nil {
			return fmt.Errorf("reading %s for the guest: %w", filepath.Base(dst), err)
		}
		_, err = c.WriteFile(ctx, dst, 0o644, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("writing %s in the guest: %w", dst, err)
		}
	}
	return nil
}

// exitedEarly is the error of a VM whose QEMU exited during its boot,
// with the agent's own error when it logged one.
func (d *Driver) exitedEarly(id string) error {
	if msg := agentError(d.dir(id)); msg != "" {
		return fmt.Errorf("QEMU exited before the agent was ready: the agent: %s", msg)
	}
	return errors.New("QEMU exited before the agent was ready")
}

// syscallKill sends SIGKILL to pid.
func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
