// Package vmguest is the first thing the agent does as PID 1 of a VM
// (`agent --vm`): it runs from the initramfs the VM driver builds, loads
// the kernel modules listed there, mounts the sandbox's disk and makes it
// the root, so that the agent then serves as it does in a container.
//
// It owns nothing after Boot returns and knows nothing of the agent
// protocol or the host. The contract with the driver is the initramfs
// layout (ModulesFile, AgentPath) and the names below: the root disk is
// the first virtio block device and the agent's serial port carries
// PortName.
package vmguest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The initramfs layout.
const (
	// AgentPath is the agent binary, run as the kernel's rdinit.
	AgentPath = "/agent"
	// ModulesFile lists kernel module files (paths in the initramfs), one
	// a line, in the order they must be loaded.
	ModulesFile = "/modules"
)

// Names shared with the driver.
const (
	// PortName is the name of the virtio-serial port the agent dials.
	PortName = "corral.agent"
	// PortPath is where Boot links that port, as udev would.
	PortPath = "/dev/virtio-ports/" + PortName
	// RootDevice is the sandbox's root disk.
	RootDevice = "/dev/vda"
	// AgentDest is where the agent binary appears in the sandbox's root,
	// as under the other runtimes.
	AgentDest = "/.corral/agent"
)

// deviceWait bounds the wait for a device to appear after its driver
// loads: probing is asynchronous, and slow under emulation.
const deviceWait = 20 * time.Second

// newRoot is where the root disk is mounted before it becomes "/".
const newRoot = "/newroot"

// Options are what Boot sets up besides the root.
type Options struct {
	// Hostname is the host name to set; empty keeps the kernel's.
	Hostname string
	// MemoryBytes and Pids are the sandbox's limits, enforced by the
	// guest kernel in the cgroup SandboxCgroup, which the agent and
	// everything it starts live in; zero is unlimited. The VM itself is
	// larger than the memory limit by what the guest kernel and the agent
	// need, so a memory bomb is killed in its cgroup rather than the
	// kernel running out.
	MemoryBytes, Pids int64
	// Net, when set, configures the VM's network device; without it the
	// guest has loopback only.
	Net *Network
}

// SandboxCgroup is the guest's cgroup (v2) that holds the agent and every
// process it starts.
const SandboxCgroup = "/sys/fs/cgroup/sandbox"

// Boot prepares the VM, moves the calling process into the sandbox's root
// and into SandboxCgroup. It must run as PID 1 before anything else uses the file system;
// on error the VM is unusable and the caller should exit, which panics
// the kernel and so ends the VM.
func Boot(opts Options) error {
	if os.Getpid() != 1 {
		return errors.New("--vm: the agent is not PID 1")
	}
	for _, m := range []struct{ src, dir, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := mount(m.src, m.dir, m.fstype, 0, ""); err != nil {
			return err
		}
	}
	// Allocations are never refused up front, as on a large host: a
	// program past the sandbox's memory limit meets the cgroup's OOM
	// killer, not an ENOMEM that the small VM's heuristic would give.
	if err := os.WriteFile("/proc/sys/vm/overcommit_memory", []byte("1"), 0); err != nil {
		return fmt.Errorf("setting vm.overcommit_memory: %w", err)
	}
	if err := loadModules(ModulesFile); err != nil {
		return err
	}
	if err := waitFor(RootDevice, func(fi os.FileInfo) bool { return fi.Mode()&os.ModeDevice != 0 }); err != nil {
		return err
	}
	if opts.Net != nil {
		if err := waitFor("/sys/class/net/"+netDevice, func(os.FileInfo) bool { return true }); err != nil {
			return err
		}
		if err := opts.Net.configure(); err != nil {
			return err
		}
	}
	if err := mount(RootDevice, newRoot, "ext4", 0, ""); err != nil {
		return err
	}
	if err := linkPort(); err != nil {
		return err
	}
	if err := bindAgent(); err != nil {
		return err
	}
	for _, dir := range []string{"/dev", "/proc", "/sys"} {
		if err := moveMount(dir, newRoot+dir); err != nil {
			return err
		}
	}
	if err := switchRoot(); err != nil {
		return err
	}
	if err := limit(opts.MemoryBytes, opts.Pids); err != nil {
		return err
	}
	if opts.Hostname == "" {
		return nil
	}
	if err := unix.Sethostname([]byte(opts.Hostname)); err != nil {
		return fmt.Errorf("setting host name %q: %w", opts.Hostname, err)
	}
	return nil
}

// limit mounts cgroup2, makes SandboxCgroup with the limits and moves
// the calling process into it. Swap stays off: the guest has none.
func limit(memory, pids int64) error {
	const root = "/sys/fs/cgroup"
	if err := mount("cgroup2", root, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := os.WriteFile(root+"/cgroup.subtree_control", []byte("+memory +pids +cpu"), 0); err != nil {
		return fmt.Errorf("enabling cgroup controllers: %w", err)
	}
	if err := os.Mkdir(SandboxCgroup, 0o755); err != nil {
		return fmt.Errorf("creating the sandbox cgroup: %w", err)
	}
	value := func(v int64) []byte {
		if v <= 0 {
			return []byte("max")
		}
		return []byte(strconv.FormatInt(v, 10))
	}
	for file, v := range map[string][]byte{"memory.max": value(memory), "pids.max": value(pids)} {
		if err := os.WriteFile(SandboxCgroup+"/"+file, v, 0); err != nil {
			return fmt.Errorf("setting %s: %w", file, err)
		}
	}
	if err := os.WriteFile(SandboxCgroup+"/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("joining the sandbox cgroup: %w", err)
	}
	return nil
}

// mount makes dir and mounts src there.
func mount(src, dir, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := unix.Mount(src, dir, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, dir, err)
	}
	return nil
}

func moveMount(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving mount %s to %s: %w", src, dst, err)
	}
	return nil
}

// loadModules loads every module the file at list names, in order. A
// module that is already loaded (built in, or loaded as a dependency)
// is fine.
func loadModules(list string) error {
	b, err := os.ReadFile(list)
	if err != nil {
		return fmt.Errorf("reading module list: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		if err := loadModule(name); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("opening module: %w", err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading module %s: %w", name, err)
	}
	return nil
}

// waitFor polls until path exists and ok accepts it.
func waitFor(path string, ok func(os.FileInfo) bool) error {
	deadline := time.Now().Add(deviceWait)
	for {
		fi, err := os.Stat(path)
		if err == nil && ok(fi) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not there after %v", path, deviceWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// linkPort finds the virtio-serial port named PortName and links it at
// PortPath: the kernel names ports vportNpM and publishes their names
// in sysfs only.
func linkPort() error {
	deadline := time.Now().Add(deviceWait)
	for {
		dev, err := findPort(PortName)
		if err != nil {
			return err
		}
		if dev != "" {
			if err := os.MkdirAll(filepath.Dir(PortPath), 0o755); err != nil {
				return fmt.Errorf("creating %s: %w", filepath.Dir(PortPath), err)
			}
			if err := os.Symlink("../"+dev, PortPath); err != nil {
				return fmt.Errorf("linking the agent port: %w", err)
			}
			return waitFor(PortPath, func(fi os.FileInfo) bool { return fi.Mode()&os.ModeCharDevice != 0 })
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for the virtio-serial port %s: not there after %v", PortName, deviceWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// findPort returns the device name of the port called name, or "" when
// no such port is there yet.
func findPort(name string) (string, error) {
	const class = "/sys/class/virtio-ports"
	entries, err := os.ReadDir(class)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("listing virtio ports: %w", err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(class, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return e.Name(), nil
		}
	}
	return "", nil
}

// bindAgent makes the agent binary of the initramfs appear at AgentDest
// in the new root, read-only, for programs that start it by that path
// (a template's code interpreter).
func bindAgent() error {
	dst := newRoot + AgentDest
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dst), err)
	}
	if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			return fmt.Errorf("creating %s: %w", dst, err)
		}
		f.Close()
	}
	if err := unix.Mount(AgentPath, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the agent at %s: %w", AgentDest, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", AgentDest, err)
	}
	return nil
}

// switchRoot makes newRoot the root of the calling process, as
// switch_root(8) does: the initramfs stays underneath, unreachable.
func switchRoot() error {
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("entering %s: %w", newRoot, err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("changing root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	return nil
}
