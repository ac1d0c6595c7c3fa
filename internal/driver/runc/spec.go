package runc

import (
	"fmt"
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/seccomp"
)

// AgentDest is where the agent binary appears inside every sandbox.
const AgentDest = "/.corral/agent"

// agentArgs is the argv of the sandbox's init: the agent, told where its
// ready pipe (fd 3) and listening socket (fd 4) are; see package agentserver for
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
	// Arch is the Go architecture (runtime.GOARCH); it selects the
	// system-call ABIs the seccomp profile covers.
	Arch string
	// OpenFiles is RLIMIT_NOFILE (soft and hard) of every sandbox process.
	// runc cannot raise it above the daemon's own hard limit.
	OpenFiles uint64
	// DenyIoctls are ioctl requests refused inside every sandbox besides
	// the built-in ones (seccomp.Options.DenyIoctls).
	DenyIoctls []uint64
	// InitSeccomp, when set, is the seccomp profile compiled and encoded
	// (seccomp.Compile, seccomp.Encode): the agent installs it before it
	// serves or starts anything, and the spec names no profile for the
	// runtime to compile. Empty leaves the profile to the runtime.
	InitSeccomp string
}

// CompileSeccomp compiles h's seccomp profile for the agent to install
// (Host.InitSeccomp). It fails where seccomp.Compile does, on
// architectures it has no table for.
func (h Host) CompileSeccomp() (string, error) {
	prog, err := seccomp.Compile(seccomp.Profile(seccomp.Options{Arch: h.Arch, DenyIoctls: h.DenyIoctls}))
	if err != nil {
		return "", err
	}
	return seccomp.Encode(prog), nil
}

// UserNS places one sandbox in its own user namespace: container IDs
// 0..Size-1 are host IDs HostID..HostID+Size-1, for users and groups
// alike. The zero value means no user namespace: root in the sandbox is
// root on the host, held back only by capabilities, seccomp and
// namespaces.
type UserNS struct {
	HostID uint32
	Size   uint32
	// Path, when set, names an existing namespace with this mapping for
	// runc to join instead of making one (see userNS in userns.go).
	Path string
	// Sysfs, when set, is a sysfs mount the driver made on the host for
	// the sandbox's prepared network namespace, bind-mounted at /sys in
	// place of a new sysfs mount, which the kernel refuses when the
	// network namespace belongs to another user namespace (see
	// netns.go).
	Sysfs string
}

// caps is the capability set of the sandbox's init (the agent) and of
// every process it starts as root; processes started as another user
// lose them all at execve, as usual. It is Docker's default set minus
// MKNOD, NET_RAW, SETFCAP, SETPCAP, SYS_CHROOT and AUDIT_WRITE
// (docs/SECURITY.md says why each kept one is needed). None of them
// reaches beyond the sandbox's own files and processes.
var caps = []string{
	// Package managers, tar and the file API chown files to the users
	// they belong to (dpkg, pip, npm as root).
	"CAP_CHOWN",
	// Root reads and writes files of the sandbox's other users (a repo
	// cloned as a user, apt's _apt-owned cache).
	"CAP_DAC_OVERRIDE",
	// chmod and utimes on files root does not own (cp -p, tar, pip).
	"CAP_FOWNER",
	// Keep set-group-ID bits when root installs such files (dpkg).
	"CAP_FSETID",
	// The agent runs processes as the user an exec asks for, and root
	// processes drop to other users (apt's _apt sandbox, su).
	"CAP_SETUID",
	"CAP_SETGID",
	// The agent signals process groups of processes that run as other
	// users (timeouts, kill, disconnects).
	"CAP_KILL",
	// Servers bind ports below 1024 in the sandbox's own network
	// namespace.
	"CAP_NET_BIND_SERVICE",
}

// maskedPaths hide kernel interfaces under /proc and /sys that leak host
// information or allow host changes: Docker's list plus the kernel log
// (syslog(2) is denied by seccomp; /proc/kmsg is the same log as a file)
// and kernel symbol addresses.
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
		"/proc/kmsg",
		"/proc/kallsyms",
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

// oomScoreAdj makes a host-wide out-of-memory kill pick sandbox processes
// before the daemon and host services. Processes can raise it but not
// lower it without CAP_SYS_RESOURCE.
const oomScoreAdj = 500

// OCISpec returns the OCI runtime configuration (config.json) of the
// sandbox s on host h, in user namespace u (none when zero). It is a pure
// function of its arguments.
func OCISpec(s driver.Spec, h Host, u UserNS) *specs.Spec {
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	oomAdj := oomScoreAdj
	spec := &specs.Spec{
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
				Bounding:  append([]string(nil), caps...),
				Effective: append([]string(nil), caps...),
				Permitted: append([]string(nil), caps...),
			},
			// no_new_privs: execve never grants privileges, so setuid
			// binaries and file capabilities in the image do nothing
			// (sudo and ping as a non-root user fail). The agent still
			// switches users: setuid(2) needs CAP_SETUID, not execve.
			NoNewPrivileges: true,
			Rlimits:         specRlimits(h, u),
			OOMScoreAdj:     &oomAdj,
		},
		// "root.path: the path to the root filesystem for the container.
		// [...] The value SHOULD be an absolute path."
		Root:     &specs.Root{Path: s.RootFS, Readonly: false},
		Hostname: hostname,
		Mounts:   append(mounts(h), hostMounts(s.Mounts)...),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.IPCNamespace},
				// A new network namespace holds only loopback, which runc
				// brings up, unless the spec names a prepared one
				// (withNetwork).
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
			Seccomp:       seccomp.Profile(seccomp.Options{Arch: h.Arch, DenyIoctls: h.DenyIoctls}),
		},
	}
	if h.InitSeccomp != "" {
		spec.Linux.Seccomp = nil
		spec.Process.Args = append(spec.Process.Args, "--seccomp="+h.InitSeccomp)
	}
	if u.Size > 0 {
		withUserNS(spec, h, u)
	}
	if n := s.Network; n != nil {
		withNetwork(spec, n, u)
	}
	return spec
}

// withUserNS makes spec join the user namespace u, whose root is host ID
// u.HostID.
func withUserNS(spec *specs.Spec, h Host, u UserNS) {
	// runc cannot set rlimits in this namespace (specRlimits): the
	// agent lowers its own before it serves.
	for _, r := range rlimits(h) {
		spec.Process.Args = append(spec.Process.Args, fmt.Sprintf("--rlimit=%s=%d", r.name, r.value))
	}
	// "uidMappings (array of objects, OPTIONAL) describes the user
	// namespace uid mappings from the host to the container."
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: u.HostID, Size: u.Size}}
	// "path: [...] the runtime MUST place the container process in
	// the namespace associated with that path." runc still needs the
	// mappings to know which host IDs own the nodes it creates.
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: u.Path})
	spec.Linux.UIDMappings = m
	spec.Linux.GIDMappings = append([]specs.LinuxIDMapping(nil), m...)
}

// withNetwork makes spec join the network namespace the daemon prepared
// and see its name service files and proxy environment. In a user
// namespace the spec names no network namespace at all: "If a namespace
// type is not specified in the namespaces array, the container MUST
// inherit the runtime namespace of that type", and the driver runs runc
// inside the prepared one (see netns.go).
func withNetwork(spec *specs.Spec, n *driver.Network, u UserNS) {
	nss := spec.Linux.Namespaces[:0]
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			if u.Size > 0 {
				continue
			}
			// "path: [...] the runtime MUST place the container process
			// in the namespace associated with that path."
			ns.Path = n.NetNSPath
		}
		nss = append(nss, ns)
	}
	spec.Linux.Namespaces = nss
	if u.Sysfs != "" {
		for i, m := range spec.Mounts {
			if m.Destination == "/sys" {
				spec.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: u.Sysfs,
					Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
			}
		}
	}
	for _, f := range []struct{ src, dst string }{{n.ResolvConf, "/etc/resolv.conf"}, {n.Hosts, "/etc/hosts"},
		{n.CABundle, driver.CABundleDest}, {n.CACert, driver.CACertDest}} {
		if f.src != "" {
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: f.dst, Type: "bind", Source: f.src,
				Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
		}
	}
	spec.Process.Env = append(spec.Process.Env, n.Env...)
}

// rlimit is one resource limit, soft and hard alike.
type rlimit struct {
	name     string // as the OCI spec names it
	resource int
	value    uint64
}

// rlimits are the resource limits of every process in the sandbox. No
// core dumps: they fill the sandbox's disk and nobody collects them.
// RLIMIT_NPROC is left alone on purpose: without a user namespace it
// counts every process of host root.
func rlimits(h Host) []rlimit {
	out := []rlimit{{"RLIMIT_CORE", unix.RLIMIT_CORE, 0}}
	if h.OpenFiles > 0 {
		out = append(out, rlimit{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, h.OpenFiles})
	}
	return out
}

// specRlimits are rlimits for runc to set. In a user namespace of its own
// the agent sets them on itself (its --rlimit), because runc cannot: it
// sets them with prlimit(2) from outside, which needs CAP_SYS_RESOURCE
// over a namespace root does not own, and root lacks it on some hosts.
func specRlimits(h Host, u UserNS) []specs.POSIXRlimit {
	if u.Size > 0 {
		return nil
	}
	return Rlimits(h)
}

// Rlimits are the resource limits of every sandbox process on host h in
// the spec's form (process.rlimits), for runtimes that apply them
// whatever the user namespace, as gVisor does inside its kernel.
func Rlimits(h Host) []specs.POSIXRlimit {
	var out []specs.POSIXRlimit
	for _, r := range rlimits(h) {
		out = append(out, specs.POSIXRlimit{Type: r.name, Hard: r.value, Soft: r.value})
	}
	return out
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

// hostMounts binds the prepared host directories ms in order, after the
// root's own mounts and before the network files (withNetwork), which a
// mount over /etc must not hide. Recursive, as the prepared source may
// hold mounts of its own. runc creates a missing target itself, resolving
// symlinks in the path as if the sandbox root were "/" (so a symlink the
// root plants at a target never leads out of it), and refuses a target
// whose resolved path leaves the root when it mounts.
func hostMounts(ms []driver.Mount) []specs.Mount {
	out := make([]specs.Mount, 0, len(ms))
	for _, m := range ms {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: opts})
	}
	return out
}

// KeepLockedFlags adds to the binds of ms in spec (made by OCISpec) the
// options that keep their sources' read-only, noexec and access-time
// flags (ocirt.LockedOptions). runc remounts a bind to apply its options,
// which the kernel refuses in a user namespace when it would clear such a
// flag; keeping them everywhere gives a sandbox the same view of a mount
// with and without one. It reads each source's mount flags.
func KeepLockedFlags(spec *specs.Spec, ms []driver.Mount) error {
	for _, m := range ms {
		i := slices.IndexFunc(spec.Mounts, func(sm specs.Mount) bool {
			return sm.Type == "bind" && sm.Destination == m.Target && sm.Source == m.Source
		})
		if i < 0 {
			continue
		}
		opts, err := ocirt.LockedOptions(m.Source)
		if err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
		for _, o := range opts {
			if !slices.Contains(spec.Mounts[i].Options, o) {
				spec.Mounts[i].Options = append(spec.Mounts[i].Options, o)
			}
		}
	}
	return nil
}

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
		quota := ocirt.LimitsOf(r).CPUQuota
		period := uint64(ocirt.CFSPeriod)
		out.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if r.Pids > 0 {
		pids := r.Pids
		out.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return out
}

// PrepareTemplate creates the agent's mount point (AgentDest, an empty
// file), and /etc/resolv.conf, /etc/hosts and the trust store's files
// (driver.CABundleDest, driver.CACertDest) where missing, in a new
// template tree. Without them runc creates the files in every
// sandbox root, which on btrfs is the first write into a fresh snapshot
// and costs a copy-on-write per create. With Config.UserNamespaces it then
// shifts the owners of every file into the sandbox ID range (shiftOwners),
// which marks the template's sandboxes for user namespaces; that costs a
// walk of the tree, once per template.
func (d *Driver) PrepareTemplate(dir string) error {
	if err := makeAgentMountPoint(dir); err != nil {
		return err
	}
	if d.cfg.UserNamespaces {
		return shiftOwners(dir)
	}
	return nil
}

func makeAgentMountPoint(dir string) error {
	// The name service and trust store files are mount points of
	// prepared networks (withNetwork).
	return ocirt.MakeMountPoints(dir, []string{AgentDest, "/etc/resolv.conf", "/etc/hosts", driver.CABundleDest, driver.CACertDest}, nil)
}
