package runc

import (
	"fmt"
	"os"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corralrun/corral/internal/driver"
)

// AgentDest is where the agent binary appears inside every sandbox.
const AgentDest = "/.corral/agent"

// agentArgs is the argv of the sandbox's init: the agent, told where its
// ready pipe (fd 3) and listening socket (fd 4) are; see package agentd for
// the start-up contract.
var agentArgs = []string{AgentDest, "agent", "--listen-fd=4", "--ready-fd=3"}

// Host holds the facts about the host and the daemon's configuration that
// shape a container's OCI spec. OCISpec needs nothing else, which keeps it
// a pure function that other OCI drivers (gVisor) can reuse.
type Host struct {
	// AgentPath is the host path of the agent binary, bind-mounted
	// read-only at AgentDest.
	AgentPath string
	// CgroupParent is the cgroup path under which each container gets
	// <CgroupParent>/<id>.
	CgroupParent string
	// CgroupV2 is true when the host runs the unified hierarchy only.
	CgroupV2 bool
	// SwapAccounting is true on cgroup v1 hosts where memory.memsw.* exist;
	// without it runc cannot set a memory+swap limit.
	SwapAccounting bool
}

// defaultCaps is Docker's default capability set. Issue 4 replaces it with
// a smaller documented set.
var defaultCaps = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_MKNOD",
	"CAP_NET_RAW",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths follow Docker's defaults: kernel interfaces
// under /proc and /sys that leak host information or allow host changes.
var (
	maskedPaths = []string{
		"/proc/asound",
		"/proc/acpi",
		"/proc/interrupts",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sched_debug",
		"/proc/scsi",
		"/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
		"/proc/sysrq-trigger",
	}
)

// OCISpec returns the OCI runtime configuration (config.json) of the
// sandbox s on host h. It is a pure function of its arguments.
func OCISpec(s driver.Spec, h Host) *specs.Spec {
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: append([]string(nil), agentArgs...),
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/root",
			},
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  append([]string(nil), defaultCaps...),
				Effective: append([]string(nil), defaultCaps...),
				Permitted: append([]string(nil), defaultCaps...),
			},
		},
		// "root.path: the path to the root filesystem for the container.
		// [...] The value SHOULD be an absolute path."
		Root:     &specs.Root{Path: s.RootFS, Readonly: false},
		Hostname: hostname,
		Mounts:   mounts(h),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.IPCNamespace},
				// A new network namespace holds only loopback, which the
				// agent brings up; networking is configured by issue 3.
				{Type: specs.NetworkNamespace},
				// A cgroup namespace makes the sandbox's own cgroup its
				// root, so /proc/self/cgroup and the cgroup mount below
				// show its limits without revealing host cgroup paths.
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath:   path.Join("/", h.CgroupParent, s.ID),
			Resources:     resources(s.Resources, h),
			MaskedPaths:   append([]string(nil), maskedPaths...),
			ReadonlyPaths: append([]string(nil), readonlyPaths...),
		},
	}
}

func mounts(h Host) []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		// Programs read their memory and CPU limits here (runtimes size
		// heaps and worker pools from them). Read-only: limits are the
		// daemon's to change.
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: AgentDest, Type: "bind", Source: h.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
}

// cfsPeriod is the CFS period in microseconds; quotas are relative to it.
const cfsPeriod = 100000

// resources turns the sandbox limits into cgroup settings. Zero limits are
// left out (unlimited). Devices: deny everything here; runc adds its
// default allow list for the standard nodes (/dev/null, zero, full, random,
// urandom, tty, ptmx) that it creates.
func resources(r driver.Resources, h Host) *specs.LinuxResources {
	out := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if r.MemoryBytes > 0 {
		limit := r.MemoryBytes
		m := &specs.LinuxMemory{Limit: &limit}
		// "swap: total memory limit (memory + swap)". Equal to the limit
		// means no swap. On v2, runc sets memory.swap.max to swap-limit = 0;
		// on v1 it needs memory.memsw.limit_in_bytes to exist.
		if h.CgroupV2 || h.SwapAccounting {
			swap := limit
			m.Swap = &swap
		}
		if !h.CgroupV2 {
			var zero uint64
			m.Swappiness = &zero
		}
		out.Memory = m
	}
	if r.MilliCPUs > 0 {
		quota := r.MilliCPUs * cfsPeriod / 1000
		period := uint64(cfsPeriod)
		out.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if r.Pids > 0 {
		pids := r.Pids
		out.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return out
}

// updateResources is the `runc update -r` document for r: unlike at
// create, a zero limit must be written as "unlimited" (-1) to lift an
// earlier limit.
func updateResources(r driver.Resources, h Host) *specs.LinuxResources {
	unlimited := int64(-1)
	memory, quota, pids := unlimited, unlimited, unlimited
	if r.MemoryBytes > 0 {
		memory = r.MemoryBytes
	}
	if r.MilliCPUs > 0 {
		quota = r.MilliCPUs * cfsPeriod / 1000
	}
	if r.Pids > 0 {
		pids = r.Pids
	}
	period := uint64(cfsPeriod)
	out := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &memory},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Pids:   &specs.LinuxPids{Limit: &pids},
	}
	if h.CgroupV2 || h.SwapAccounting {
		swap := memory
		out.Memory.Swap = &swap
	}
	return out
}

// PrepareTemplate creates the agent's mount point (AgentDest, an empty
// file) in a new template tree. Without it runc creates the file in every
// sandbox root, which on btrfs is the first write into a fresh snapshot
// and costs several milliseconds of copy-on-write per create.
func (d *Driver) PrepareTemplate(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening template tree: %w", err)
	}
	defer root.Close()
	rel := strings.TrimPrefix(AgentDest, "/")
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", path.Dir(AgentDest), err)
	}
	f, err := root.OpenFile(rel, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		return fmt.Errorf("creating mount point %s: %w", AgentDest, err)
	}
	return f.Close()
}
