package seccomp

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// verdict evaluates p for one call the way runc installs it: the first
// rule naming the call whose conditions all hold decides; otherwise the
// default action applies. It returns the errno, or 0 for allowed.
func verdict(p *specs.LinuxSeccomp, name string, args ...uint64) uint {
	for _, s := range p.Syscalls {
		if !slices.Contains(s.Names, name) {
			continue
		}
		match := true
		for _, a := range s.Args {
			var v uint64
			if int(a.Index) < len(args) {
				v = args[a.Index]
			}
			switch a.Op {
			case specs.OpMaskedEqual:
				match = match && v&a.Value == a.ValueTwo
			case specs.OpEqualTo:
				match = match && v == a.Value
			default:
				panic("operator not modelled: " + string(a.Op))
			}
		}
		if match {
			if s.Action != specs.ActErrno || s.ErrnoRet == nil {
				panic("rule without errno action")
			}
			return *s.ErrnoRet
		}
	}
	if p.DefaultAction != specs.ActAllow {
		panic("default action not modelled")
	}
	return 0
}

func TestProfileDenies(t *testing.T) {
	p := Profile(Options{Arch: "amd64", DenyIoctls: []uint64{0x50009401}})
	eperm, enosys := uint(unix.EPERM), uint(unix.ENOSYS)
	const goThread = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	tests := []struct {
		name    string
		syscall string
		args    []uint64
		want    uint
	}{
		{"module load", "finit_module", nil, eperm},
		{"module init", "init_module", nil, eperm},
		{"module delete", "delete_module", nil, eperm},
		{"kexec", "kexec_load", nil, eperm},
		{"kexec file", "kexec_file_load", nil, eperm},
		{"reboot", "reboot", nil, eperm},
		{"mount", "mount", nil, eperm},
		{"umount2", "umount2", nil, eperm},
		{"pivot_root", "pivot_root", nil, eperm},
		{"new mount api", "fsopen", nil, eperm},
		{"swapon", "swapon", nil, eperm},
		{"swapoff", "swapoff", nil, eperm},
		{"ptrace", "ptrace", []uint64{unix.PTRACE_ATTACH, 1}, eperm},
		{"process_vm_readv", "process_vm_readv", nil, eperm},
		{"process_vm_writev", "process_vm_writev", nil, eperm},
		{"keyctl", "keyctl", nil, eperm},
		{"add_key", "add_key", nil, eperm},
		{"request_key", "request_key", nil, eperm},
		{"bpf", "bpf", nil, eperm},
		{"perf_event_open", "perf_event_open", nil, eperm},
		{"userfaultfd", "userfaultfd", nil, eperm},
		{"io_uring", "io_uring_setup", nil, eperm},
		{"open_by_handle_at", "open_by_handle_at", nil, eperm},
		{"name_to_handle_at", "name_to_handle_at", nil, eperm},
		{"setns", "setns", nil, eperm},
		{"acct", "acct", nil, eperm},
		{"quotactl", "quotactl", nil, eperm},
		{"lookup_dcookie", "lookup_dcookie", nil, eperm},
		{"iopl", "iopl", nil, eperm},
		{"ioperm", "ioperm", nil, eperm},
		{"syslog", "syslog", nil, eperm},
		{"settimeofday", "settimeofday", nil, eperm},
		{"clock_settime", "clock_settime", nil, eperm},
		{"adjtimex", "adjtimex", nil, eperm},
		{"nfsservctl", "nfsservctl", nil, eperm},
		{"vm86", "vm86", nil, eperm},
		{"fanotify_init", "fanotify_init", nil, eperm},
		{"clone3 falls back", "clone3", nil, enosys},

		{"unshare user", "unshare", []uint64{unix.CLONE_NEWUSER}, eperm},
		{"unshare net+mount", "unshare", []uint64{unix.CLONE_NEWNET | unix.CLONE_NEWNS}, eperm},
		{"unshare time", "unshare", []uint64{unix.CLONE_NEWTIME}, eperm},
		{"unshare files", "unshare", []uint64{unix.CLONE_FILES}, 0},
		{"unshare fs", "unshare", []uint64{unix.CLONE_FS}, 0},
		{"clone new user", "clone", []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone new pid", "clone", []uint64{unix.CLONE_NEWPID | uint64(unix.SIGCHLD)}, eperm},
		{"clone fork", "clone", []uint64{uint64(unix.SIGCHLD)}, 0},
		{"clone vfork", "clone", []uint64{unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD)}, 0},
		{"clone thread", "clone", []uint64{goThread}, 0},
		{"clone pidfd", "clone", []uint64{unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, 0},

		{"TIOCSTI", "ioctl", []uint64{0, unix.TIOCSTI}, eperm},
		{"TIOCSTI high bits", "ioctl", []uint64{0, 1<<32 | unix.TIOCSTI}, eperm},
		{"extra ioctl", "ioctl", []uint64{0, 0x50009401}, eperm},
		{"TCGETS", "ioctl", []uint64{0, unix.TCGETS}, 0},
		{"TIOCGWINSZ", "ioctl", []uint64{0, unix.TIOCGWINSZ}, 0},
		{"TIOCINQ", "ioctl", []uint64{0, unix.TIOCINQ}, 0},

		{"personality linux", "personality", []uint64{0}, 0},
		{"personality query", "personality", []uint64{0xffffffff}, 0},
		{"personality query 64-bit", "personality", []uint64{0xffffffffffffffff}, 0},
		{"personality high bits only", "personality", []uint64{1 << 40}, 0},
		{"personality no aslr", "personality", []uint64{0x0040000}, eperm},
		{"personality read implies exec", "personality", []uint64{0x0400000}, eperm},
		{"personality uname26", "personality", []uint64{0x0008}, eperm},
		{"personality linux32", "personality", []uint64{0x0008 | 0x20000}, eperm},
		{"personality all but one bit", "personality", []uint64{0x7fffffff}, eperm},
		{"personality top bit", "personality", []uint64{0x80000000}, eperm},

		{"read", "read", nil, 0},
		{"openat", "openat", nil, 0},
		{"execve", "execve", nil, 0},
		{"setuid", "setuid", nil, 0},
		{"chroot", "chroot", nil, 0},
		{"landlock", "landlock_create_ruleset", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := verdict(p, tt.syscall, tt.args...); got != tt.want {
				t.Errorf("%s(%#x) = errno %d, want %d", tt.syscall, tt.args, got, tt.want)
			}
		})
	}
}

// TestPersonalityExhaustive checks the ring construction against the plain
// rule on every single bit and pair of bits, plus the edges.
func TestPersonalityExhaustive(t *testing.T) {
	p := Profile(Options{Arch: "amd64"})
	check := func(x uint64) {
		low := x & 0xffffffff
		want := uint(unix.EPERM)
		if low == 0 || low == 0xffffffff {
			want = 0
		}
		if got := verdict(p, "personality", x); got != want {
			t.Fatalf("personality(%#x) = %d, want %d", x, got, want)
		}
	}
	for i := range 32 {
		for j := range 32 {
			check(1<<i | 1<<j)
			check(0xffffffff &^ (1<<i | 1<<j))
		}
	}
	check(0)
	check(0xffffffff)
	check(0xffffffff00000000)
}

func TestArchitectures(t *testing.T) {
	// Only the native ABI: the others fall to the bad-architecture action
	// (test/hostile probes an i386 call).
	if got := Profile(Options{Arch: "amd64"}).Architectures; !slices.Equal(got, []specs.Arch{specs.ArchX86_64}) {
		t.Errorf("amd64 profile: got %v, want x86-64 only", got)
	}
	if got := Profile(Options{Arch: "s390x"}).Architectures; got != nil {
		t.Errorf("s390x: got %v, want nil (clone takes flags second there)", got)
	}
}
