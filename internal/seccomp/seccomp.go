// Package seccomp builds the system-call filter that every container
// sandbox runs under, as an OCI runtime-spec LinuxSeccomp document that runc
// (and runsc --oci-seccomp) install before the sandbox's init starts.
//
// The profile allows by default and denies a named list. It is a second
// layer under the capability set, not the only one: most calls it names
// also need a capability the sandbox does not have. It exists for the calls
// that an unprivileged process can make and that reach kernel code which
// has no business running for an untrusted workload (user namespaces, eBPF,
// perf, io_uring, keyrings, userfaultfd), or that inspect or change another
// process (ptrace and friends). docs/SECURITY.md lists the reasoning; the
// trade-off of default-allow is that a system call added by a future
// kernel is allowed until it is named here.
//
// The package knows nothing about drivers or storage: callers pass the
// extra ioctl requests to deny (the btrfs backend's subvolume ioctls).
package seccomp

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Options parameterize Profile.
type Options struct {
	// Arch is the Go architecture (runtime.GOARCH) the sandbox runs on;
	// it selects the system-call ABIs the filter covers.
	Arch string
	// DenyIoctls are ioctl request numbers refused with EPERM in addition
	// to TIOCSTI, for example btrfs.SubvolumeIoctls().
	DenyIoctls []uint64
}

// Errno values the profile returns. EPERM says "not allowed here", which
// programs report clearly; ENOSYS says "this kernel has no such call",
// which makes libc fall back to an older call that can be filtered.
var (
	eperm  = uint(unix.EPERM)
	enosys = uint(unix.ENOSYS)
)

// denied are refused with EPERM whatever their arguments. Grouped by why.
var denied = [][]string{
	// Kernel code and the running kernel: loading modules, replacing the
	// kernel, rebooting.
	{"init_module", "finit_module", "delete_module", "create_module", "query_module",
		"get_kernel_syms", "kexec_load", "kexec_file_load", "reboot"},
	// The mount table, old and new API, and swap. The sandbox's mounts are
	// set up once by the runtime; nothing inside needs to change them.
	{"mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
		"move_mount", "open_tree", "open_tree_attr", "mount_setattr", "swapon", "swapoff"},
	// Joining other namespaces. Creating them is filtered on the clone and
	// unshare flags below; clone3 passes its flags in memory, which seccomp
	// cannot read, so it gets ENOSYS (see Profile).
	{"setns"},
	// Another process's memory, file descriptors or state. This also
	// rules out debuggers (gdb, strace) inside the sandbox.
	{"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "process_madvise"},
	// Kernel keyrings are not namespaced: keys are per host user.
	{"keyctl", "add_key", "request_key"},
	// Large kernel surfaces reachable without capabilities and a steady
	// source of privilege-escalation bugs: eBPF, perf events,
	// userfaultfd (used to win kernel races) and io_uring (its operations
	// also bypass this filter). Returning EPERM matches what these calls
	// return when a host disables them, which programs handle (libuv
	// falls back to its thread pool).
	{"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"},
	// File handles bypass path-based access checks ("shocker").
	{"open_by_handle_at", "name_to_handle_at"},
	// Host-wide accounting, quotas, profiling and logs.
	{"acct", "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl", "syslog", "fanotify_init"},
	// Raw I/O ports and legacy x86 modes.
	{"iopl", "ioperm", "vm86", "vm86old"},
	// The host clock is shared by every sandbox.
	{"settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex"},
}

// nsFlags are the clone/unshare flags that create namespaces. An
// unprivileged process can create a user namespace and, inside it, every
// other kind, which opens kernel code (netfilter, mounts of many file
// systems) that the host otherwise keeps behind CAP_SYS_ADMIN.
var nsFlags = []uint64{
	unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
	unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET,
}

// tiocsti fakes terminal input: a process that shares a terminal with
// another (a PTY session) could type commands into it.
const tiocsti = unix.TIOCSTI

// Profile returns the seccomp profile for a sandbox. It is a pure function
// of o and returns a new value on every call.
func Profile(o Options) *specs.LinuxSeccomp {
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: architectures(o.Arch),
	}
	deny := func(s specs.LinuxSyscall) {
		s.Action = specs.ActErrno
		if s.ErrnoRet == nil {
			s.ErrnoRet = &eperm
		}
		p.Syscalls = append(p.Syscalls, s)
	}
	for _, group := range denied {
		deny(specs.LinuxSyscall{Names: append([]string(nil), group...)})
	}
	// "clone3() [...] flags are passed in a structure": seccomp sees only
	// the pointer. ENOSYS makes glibc (2.34+) retry with clone, whose
	// flags are filtered next.
	deny(specs.LinuxSyscall{Names: []string{"clone3"}, ErrnoRet: &enosys})

	// One rule per flag: runc ORs conditions only across rules (several
	// conditions in one rule must all match). clone's flags are its first
	// argument on every ABI listed in architectures.
	for _, f := range nsFlags {
		deny(maskedRule("clone", 0, f, f))
	}
	for _, f := range append(nsFlags, unix.CLONE_NEWTIME) {
		deny(maskedRule("unshare", 0, f, f))
	}

	// ioctl's request is an unsigned int: the kernel ignores the upper 32
	// bits of the register, so the comparison must too, or a caller
	// could set them and slip past an exact 64-bit match.
	for _, req := range append([]uint64{tiocsti}, o.DenyIoctls...) {
		deny(maskedRule("ioctl", 1, 0xffffffff, req&0xffffffff))
	}

	// personality(2) may only select PER_LINUX (0) or query the current
	// persona (0xffffffff); other personas turn off ASLR
	// (ADDR_NO_RANDOMIZE), make data executable (READ_IMPLIES_EXEC) or
	// enter rarely used emulation code. The kernel reads the argument as
	// an unsigned int. "Any value other than those two" is "some bit is
	// set and some bit is clear", and on the ring of 32 bits that holds
	// exactly when some bit b is set while bit b+1 (mod 32) is clear: one
	// masked rule per b.
	for b := range uint64(32) {
		set, next := uint64(1)<<b, uint64(1)<<((b+1)%32)
		deny(maskedRule("personality", 0, set|next, set))
	}
	return p
}

// maskedRule matches name when (argument index & mask) == value.
func maskedRule(name string, index uint, mask, value uint64) specs.LinuxSyscall {
	return specs.LinuxSyscall{
		Names: []string{name},
		Args:  []specs.LinuxSeccompArg{{Index: index, Value: mask, ValueTwo: value, Op: specs.OpMaskedEqual}},
	}
}

// architectures lists the one system-call ABI the filter covers: the
// native one. A call through another ABI matches no rule but is stopped
// by libseccomp, which runc compiles the profile with: an i386 call
// (`int 0x80` on amd64; arm on arm64) carries another architecture and
// gets the filter's bad-architecture action, and an x32 call, which
// carries x86-64's, has a number of 0x40000000 or more, which a filter
// without x32 sends to the same action: the calling thread is killed.
// gVisor implements the native ABI only. So 32-bit programs do not run in
// a sandbox, and the kernel's compat system-call layer, a steady source
// of bugs, is out of reach (docs/SECURITY.md). Listing the compat ABIs as
// well would let them through the filtered calls' rules and make every
// sandbox's filter longer. The flag rules above
// assume clone takes its flags first, which holds on these architectures
// (not on s390x, which is therefore not listed); an unknown arch gets
// nil, the runtime's native ABI.
func architectures(arch string) []specs.Arch {
	switch arch {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64}
	case "riscv64":
		return []specs.Arch{specs.ArchRISCV64}
	}
	return nil
}
