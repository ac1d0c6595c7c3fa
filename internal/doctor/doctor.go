// Package doctor inspects the host and says which of Corral's runtimes and
// storage backends can work here, and what to do about those that cannot.
// It only reads: it never changes the host. The checks are quick (no
// sandbox is started) so `corral doctor` answers in well under a second.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/driver/vm"
)

// RunscVersion is the gVisor release Corral is tested with; scripts/deps.sh
// builds exactly this one.
const RunscVersion = "release-20260527.0"

// Check is one finding.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Fix says what to do when OK is false.
	Fix string `json:"fix,omitempty"`
}

// Runtime says whether a runtime can start sandboxes here.
type Runtime struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Needs lists the checks that failed for it.
	Needs []string `json:"needs,omitempty"`
	// Note says how it runs where that varies: the vm runtime under KVM
	// or, without it, under TCG (software emulation).
	Note string `json:"note,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	Checks   []Check   `json:"checks"`
	Runtimes []Runtime `json:"runtimes"`
	Storage  []Runtime `json:"storage"`
}

// Host is the doctor's view of the machine; tests replace it.
type Host struct {
	Geteuid  func() int
	ReadFile func(name string) ([]byte, error)
	Stat     func(name string) (os.FileInfo, error)
	// Glob returns the names matching a filepath.Match pattern.
	Glob     func(pattern string) ([]string, error)
	LookPath func(file string) (string, error)
	// Output runs a command and returns its standard output.
	Output func(ctx context.Context, name string, args ...string) ([]byte, error)
	OpenRW func(name string) error
}

// RealHost returns the machine this process runs on.
func RealHost() Host {
	return Host{
		Geteuid:  os.Geteuid,
		ReadFile: os.ReadFile,
		Stat:     os.Stat,
		Glob:     filepath.Glob,
		LookPath: exec.LookPath,
		Output: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			return exec.CommandContext(ctx, name, args...).Output()
		},
		OpenRW: func(name string) error {
			f, err := os.OpenFile(name, os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			return err
		},
	}
}

// Run performs every check on h.
func Run(ctx context.Context, h Host) Report {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var r Report
	add := func(c Check) { r.Checks = append(r.Checks, c) }

	add(Check{Name: "root", OK: h.Geteuid() == 0, Detail: fmt.Sprintf("effective uid %d", h.Geteuid()),
		Fix: "run the daemon as root (sudo corral server)"})
	add(cgroupCheck(h))
	fsys, _ := h.ReadFile("/proc/filesystems")
	add(fsCheck(fsys, "overlay", "overlayfs"))
	add(fsCheck(fsys, "btrfs", "btrfs"))
	add(binaryCheck(ctx, h, "mkfs.btrfs", []string{"--version"}, "apt-get install btrfs-progs"))
	add(quotaCheck(h))
	add(binaryCheck(ctx, h, "runc", []string{"--version"}, "apt-get install runc"))
	add(runscCheck(ctx, h))
	add(kvmCheck(h))
	add(binaryCheck(ctx, h, "qemu-system-x86_64", []string{"--version"}, "apt-get install qemu-system-x86"))
	add(binaryCheck(ctx, h, "qemu-img", nil, "apt-get install qemu-utils"))
	add(binaryCheck(ctx, h, "mkfs.ext4", nil, "apt-get install e2fsprogs"))
	add(vmKernelCheck(h))
	add(binaryCheck(ctx, h, "debootstrap", nil, "apt-get install debootstrap (needed to build the default template)"))

	ok := func(names ...string) (bool, []string) {
		var missing []string
		for _, n := range names {
			for _, c := range r.Checks {
				if c.Name == n && !c.OK {
					missing = append(missing, n)
				}
			}
		}
		return len(missing) == 0, missing
	}
	for _, rt := range []struct {
		name  string
		needs []string
	}{
		{"runc", []string{"root", "cgroups", "runc"}},
		{"gvisor", []string{"root", "cgroups", "runsc"}},
		// KVM only makes VMs fast: without it QEMU emulates the CPU.
		{"vm", []string{"root", "cgroups", "qemu-system-x86_64", "qemu-img", "mkfs.ext4", "vm-kernel"}},
	} {
		avail, missing := ok(rt.needs...)
		r.Runtimes = append(r.Runtimes, Runtime{Name: rt.name, Available: avail, Needs: missing})
	}
	if kvm, _ := ok("kvm"); kvm {
		r.Runtimes[len(r.Runtimes)-1].Note = "VMs run under KVM"
	} else {
		r.Runtimes[len(r.Runtimes)-1].Note = "VMs run under TCG, software emulation many times slower than KVM (see the kvm check)"
	}
	for _, st := range []struct {
		name  string
		needs []string
	}{
		{"btrfs", []string{"root", "btrfs", "overlay", "mkfs.btrfs"}},
		{"overlay", []string{"root", "overlay"}},
	} {
		avail, missing := ok(st.needs...)
		r.Storage = append(r.Storage, Runtime{Name: st.name, Available: avail, Needs: missing})
	}
	return r
}

// quotaCheck reads the quota accounting state of every mounted btrfs
// filesystem: disk limits on one whose accounting is inconsistent are not
// enforced.
func quotaCheck(h Host) Check {
	c := Check{Name: "btrfs-quotas", OK: true,
		Fix: "the Corral daemon rescans by itself and refuses creates with a disk limit meanwhile; if it stays inconsistent: btrfs quota rescan -w MOUNTPOINT"}
	flags, _ := h.Glob("/sys/fs/btrfs/*/qgroups/inconsistent")
	modes := map[string]int{}
	var bad []string
	for _, f := range flags {
		uuid := filepath.Base(filepath.Dir(filepath.Dir(f)))
		mode := "full"
		if m, err := h.ReadFile(filepath.Join(filepath.Dir(f), "mode")); err == nil && strings.TrimSpace(string(m)) == "squota" {
			mode = "simple"
		}
		modes[mode]++
		if v, err := h.ReadFile(f); err == nil && strings.TrimSpace(string(v)) == "1" {
			bad = append(bad, uuid)
		}
	}
	switch {
	case len(flags) == 0:
		c.Detail = "no btrfs filesystem has quotas on"
	case len(bad) > 0:
		c.OK = false
		c.Detail = "accounting inconsistent, disk limits not enforced, on btrfs " + strings.Join(bad, ", ")
	default:
		c.Detail = fmt.Sprintf("consistent on %d btrfs filesystems (simple quotas: %d, full: %d)", len(flags), modes["simple"], modes["full"])
	}
	return c
}

// cgroupCheck finds the cgroup version and the controllers Corral needs.
func cgroupCheck(h Host) Check {
	c := Check{Name: "cgroups", Fix: "mount the cgroup controllers memory, cpu, pids and freezer (v1) or enable them in cgroup.subtree_control (v2)"}
	if b, err := h.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		have := strings.Fields(string(b))
		missing := missingOf(have, "memory", "cpu", "pids")
		c.OK = len(missing) == 0
		c.Detail = "cgroup v2, controllers: " + strings.Join(have, " ")
		if !c.OK {
			c.Detail += "; missing: " + strings.Join(missing, " ")
		}
		return c
	}
	var have []string
	for _, ctl := range []string{"memory", "cpu", "cpuacct", "pids", "freezer", "devices"} {
		if _, err := h.Stat("/sys/fs/cgroup/" + ctl); err == nil {
			have = append(have, ctl)
		}
	}
	missing := missingOf(have, "memory", "cpu", "pids", "freezer")
	c.OK = len(missing) == 0
	c.Detail = "cgroup v1, controllers: " + strings.Join(have, " ")
	if !c.OK {
		c.Detail += "; missing: " + strings.Join(missing, " ")
	}
	return c
}

func missingOf(have []string, want ...string) []string {
	var missing []string
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			missing = append(missing, w)
		}
	}
	return missing
}

func fsCheck(filesystems []byte, fstype, name string) Check {
	ok := false
	for _, line := range strings.Split(string(filesystems), "\n") {
		f := strings.Fields(line)
		ok = ok || (len(f) > 0 && f[len(f)-1] == fstype)
	}
	c := Check{Name: fstype, OK: ok, Detail: name + " is not in /proc/filesystems",
		Fix: "load the " + fstype + " kernel module (modprobe " + fstype + ") or use a kernel with it built in"}
	if ok {
		c.Detail = name + " is supported by the kernel"
	}
	return c
}

func binaryCheck(ctx context.Context, h Host, name string, versionArgs []string, fix string) Check {
	c := Check{Name: name, Fix: fix}
	p, err := h.LookPath(name)
	if err != nil {
		c.Detail = name + " not found on PATH"
		return c
	}
	c.OK, c.Detail = true, p
	if versionArgs != nil {
		if out, err := h.Output(ctx, p, versionArgs...); err == nil {
			c.Detail += ": " + firstLine(out)
		}
	}
	return c
}

func runscCheck(ctx context.Context, h Host) Check {
	c := Check{Name: "runsc", Fix: "run scripts/deps.sh: it builds runsc " + RunscVersion + " from the Go module proxy (Debian's runsc is too old for the systrap platform)"}
	p, err := h.LookPath("runsc")
	if err != nil {
		c.Detail = "runsc not found on PATH"
		return c
	}
	out, err := h.Output(ctx, p, "--version")
	if err != nil {
		c.Detail = p + ": --version failed: " + err.Error()
		return c
	}
	v := firstLine(out)
	c.Detail = p + ": " + v
	c.OK = strings.HasSuffix(v, " "+RunscVersion)
	if !c.OK {
		c.Detail += " (want " + RunscVersion + ")"
	}
	return c
}

// vmKernelCheck looks for the guest kernel of the vm runtime where
// scripts/deps.sh unpacks it.
func vmKernelCheck(h Host) Check {
	c := Check{Name: "vm-kernel", Fix: "run scripts/deps.sh: it unpacks Debian's linux-image-cloud-amd64 into " + vm.DefaultKernelDir + " (apt-get download, dpkg-deb -x)"}
	images, _ := h.Glob(filepath.Join(vm.DefaultKernelDir, "boot", "vmlinuz-*"))
	if len(images) == 0 {
		c.Detail = "no guest kernel in " + vm.DefaultKernelDir
		return c
	}
	c.OK, c.Detail = true, images[len(images)-1]
	return c
}

func kvmCheck(h Host) Check {
	c := Check{Name: "kvm", Fix: "enable hardware virtualization (or nested virtualization for a VM), load kvm_intel or kvm_amd, and give the daemon access to /dev/kvm"}
	if _, err := h.Stat("/dev/kvm"); err != nil {
		c.Detail = "/dev/kvm does not exist"
		return c
	}
	if err := h.OpenRW("/dev/kvm"); err != nil {
		c.Detail = "/dev/kvm cannot be opened: " + err.Error()
		if errors.Is(err, os.ErrPermission) {
			c.Fix = "run as root or add the daemon's user to the kvm group"
		}
		return c
	}
	c.OK, c.Detail = true, "/dev/kvm is usable"
	return c
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
