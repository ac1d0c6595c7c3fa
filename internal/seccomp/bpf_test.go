//go:build amd64

package seccomp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// run interprets prog, as the kernel does, on one call: the seccomp_data
// of number nr with architecture token arch and args (missing ones 0).
// It supports the instructions Compile emits and fails the test on any
// other, on a jump out of the program and on falling off its end.
func run(t *testing.T, prog []unix.SockFilter, arch uint32, nr int32, args ...uint64) uint32 {
	t.Helper()
	ret, _ := interpret(t, prog, arch, nr, args...)
	return ret
}

// interpret is run, also returning how many instructions ran.
func interpret(t *testing.T, prog []unix.SockFilter, arch uint32, nr int32, args ...uint64) (ret uint32, steps int) {
	t.Helper()
	var data [64]byte
	binary.LittleEndian.PutUint32(data[0:], uint32(nr))
	binary.LittleEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[16+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		steps++
		f := prog[pc]
		switch f.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if f.K%4 != 0 || f.K+4 > uint32(len(data)) {
				t.Fatalf("pc %d: load at %d", pc, f.K)
			}
			acc = binary.LittleEndian.Uint32(data[f.K:])
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			acc &= f.K
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			cond := acc == f.K
			if f.Code&0xf0 == unix.BPF_JGE {
				cond = acc >= f.K
			}
			if cond {
				pc += int(f.Jt)
			} else {
				pc += int(f.Jf)
			}
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(f.K)
		case unix.BPF_RET | unix.BPF_K:
			return f.K, steps
		default:
			t.Fatalf("pc %d: instruction %#x not modelled", pc, f.Code)
		}
	}
	t.Fatal("fell off the end of the program")
	return 0, steps
}

// TestCompileMatchesProfile runs the compiled profile on every call it
// names, with argument values from its own conditions, their neighbours
// and random ones, and checks each answer against verdict, the profile's
// meaning.
func TestCompileMatchesProfile(t *testing.T) {
	p := Profile(Options{Arch: "amd64", DenyIoctls: []uint64{0x50009401, 0xc0109428}})
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d instructions", len(prog))
	// Interesting values: every mask and value in the profile, each
	// with a bit flipped, and in the upper half.
	interesting := []uint64{0, 1, 0xffffffff, 0xffffffff00000000, ^uint64(0)}
	for _, s := range p.Syscalls {
		for _, a := range s.Args {
			for _, v := range []uint64{a.Value, a.ValueTwo} {
				interesting = append(interesting, v, v|1, v&^1, v|1<<32, v^0xffffffff)
			}
		}
	}
	// Every other number is allowed, whatever its arguments.
	named := map[int]bool{}
	for _, nr := range sysNums {
		named[nr] = true
	}
	for nr := range 1024 {
		if !named[nr] {
			if got := run(t, prog, unix.AUDIT_ARCH_X86_64, int32(nr), ^uint64(0), 0xffffffff); got != unix.SECCOMP_RET_ALLOW {
				t.Fatalf("call %d = %#x, want allowed", nr, got)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, nr := range sysNums {
		if nr < 0 {
			continue
		}
		values := append([]uint64(nil), interesting...)
		for range 50 {
			values = append(values, rng.Uint64(), uint64(rng.Uint32()))
		}
		for _, v0 := range values {
			for _, v1 := range []uint64{0, v0, unix.TIOCSTI, 0x50009401} {
				want := uint32(unix.SECCOMP_RET_ALLOW)
				if e := verdict(p, name, v0, v1); e != 0 {
					want = unix.SECCOMP_RET_ERRNO | uint32(e)
				}
				if got := run(t, prog, unix.AUDIT_ARCH_X86_64, int32(nr), v0, v1); got != want {
					t.Fatalf("%s(%#x, %#x) = %#x, want %#x", name, v0, v1, got, want)
				}
			}
		}
	}
}

func TestCompileABIs(t *testing.T) {
	prog, err := Compile(Profile(Options{Arch: "amd64"}))
	if err != nil {
		t.Fatal(err)
	}
	const kill, allow = unix.SECCOMP_RET_KILL_PROCESS, unix.SECCOMP_RET_ALLOW
	tests := []struct {
		name string
		arch uint32
		nr   int32
		want uint32
	}{
		{"x86-64 getpid", unix.AUDIT_ARCH_X86_64, unix.SYS_GETPID, allow},
		{"x86-64 number no kernel has", unix.AUDIT_ARCH_X86_64, 1000, allow},
		{"x86-64 -1 (a tracer's skipped call)", unix.AUDIT_ARCH_X86_64, -1, allow},
		{"x86-64 mount", unix.AUDIT_ARCH_X86_64, unix.SYS_MOUNT, unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{"x86-64 clone3", unix.AUDIT_ARCH_X86_64, unix.SYS_CLONE3, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"i386 getpid", unix.AUDIT_ARCH_I386, 20, kill},
		{"i386 mount", unix.AUDIT_ARCH_I386, 21, kill},
		{"x32 getpid", unix.AUDIT_ARCH_X86_64, 0x40000000 + unix.SYS_GETPID, kill},
		{"x32 mount", unix.AUDIT_ARCH_X86_64, 0x40000000 + unix.SYS_MOUNT, kill},
	}
	for _, tt := range tests {
		if got := run(t, prog, tt.arch, tt.nr); got != tt.want {
			t.Errorf("%s: %#x, want %#x", tt.name, got, tt.want)
		}
	}
}

func TestCompileRefuses(t *testing.T) {
	eperm := uint(unix.EPERM)
	base := func() *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64}}
	}
	tests := map[string]func(p *specs.LinuxSeccomp){
		"default errno":     func(p *specs.LinuxSeccomp) { p.DefaultAction = specs.ActErrno },
		"no architecture":   func(p *specs.LinuxSeccomp) { p.Architectures = nil },
		"two architectures": func(p *specs.LinuxSeccomp) { p.Architectures = append(p.Architectures, specs.ArchX86) },
		"kill action": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActKill}}
		},
		"errno without value": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActErrno}}
		},
		"unknown name": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"mount_everything"}, Action: specs.ActErrno, ErrnoRet: &eperm}}
		},
		"other operator": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"ioctl"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 1, Value: 5, Op: specs.OpEqualTo}}}}
		},
		"seventh argument": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"ioctl"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 6, Value: 5, ValueTwo: 5, Op: specs.OpMaskedEqual}}}}
		},
	}
	for name, change := range tests {
		p := base()
		change(p)
		if _, err := Compile(p); err == nil {
			t.Errorf("%s: compiled", name)
		}
	}
}

// TestCompileLongBlock: a call's rules may take more instructions than an
// 8-bit jump spans; the search reaches its block with a long jump.
func TestCompileLongBlock(t *testing.T) {
	eperm := uint(unix.EPERM)
	p := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64}}
	for i := range 100 {
		r := maskedRule("ioctl", 1, 0xffffffff, uint64(i))
		r.Action, r.ErrnoRet = specs.ActErrno, &eperm
		p.Syscalls = append(p.Syscalls, r)
	}
	r := maskedRule("mount", 0, 0, 0)
	r.Action, r.ErrnoRet = specs.ActErrno, &eperm
	p.Syscalls = append(p.Syscalls, r)
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		nr   int32
		arg  uint64
		want uint32
	}{
		{unix.SYS_IOCTL, 57, unix.SECCOMP_RET_ERRNO | uint32(eperm)},
		{unix.SYS_IOCTL, 100, unix.SECCOMP_RET_ALLOW},
		{unix.SYS_MOUNT, 0, unix.SECCOMP_RET_ERRNO | uint32(eperm)},
		{unix.SYS_GETPID, 0, unix.SECCOMP_RET_ALLOW},
	} {
		if got := run(t, prog, unix.AUDIT_ARCH_X86_64, tt.nr, 0, tt.arg); got != tt.want {
			t.Errorf("call %d (_, %d) = %#x, want %#x", tt.nr, tt.arg, got, tt.want)
		}
	}
}

// TestCompileShort checks that an allowed call runs few instructions: the
// search over the numbers with rules, not a compare per number.
func TestCompileShort(t *testing.T) {
	prog, err := Compile(Profile(Options{Arch: "amd64"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, nr := range []int32{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_MMAP, unix.SYS_FUTEX, unix.SYS_EPOLL_PWAIT, 400} {
		ret, n := interpret(t, prog, unix.AUDIT_ARCH_X86_64, nr)
		if ret != unix.SECCOMP_RET_ALLOW || n > 16 {
			t.Errorf("call %d: %#x after %d instructions, want allowed after at most 16", nr, ret, n)
		}
	}
}

// TestCompileSharesBlocks: calls with the same rules share one rule block,
// so a second plain EPERM call adds only its compare and jump; both still
// get their errno, and a call with other rules keeps its own block.
func TestCompileSharesBlocks(t *testing.T) {
	eperm, enosys := uint(unix.EPERM), uint(unix.ENOSYS)
	profile := func(names ...string) *specs.LinuxSeccomp {
		p := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64}}
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: names, Action: specs.ActErrno, ErrnoRet: &eperm},
			specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys})
		return p
	}
	one, err := Compile(profile("mount"))
	if err != nil {
		t.Fatal(err)
	}
	two, err := Compile(profile("mount", "umount2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(two) != len(one)+2 {
		t.Errorf("a second call with the same rule took %d instructions, want 2 (%d -> %d)", len(two)-len(one), len(one), len(two))
	}
	for _, tt := range []struct {
		nr   int32
		want uint32
	}{
		{unix.SYS_MOUNT, unix.SECCOMP_RET_ERRNO | uint32(eperm)},
		{unix.SYS_UMOUNT2, unix.SECCOMP_RET_ERRNO | uint32(eperm)},
		{unix.SYS_CLONE3, unix.SECCOMP_RET_ERRNO | uint32(enosys)},
		{unix.SYS_GETPID, unix.SECCOMP_RET_ALLOW},
	} {
		if got := run(t, two, unix.AUDIT_ARCH_X86_64, tt.nr, 0, 0); got != tt.want {
			t.Errorf("call %d = %#x, want %#x", tt.nr, got, tt.want)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	prog, err := Compile(Profile(Options{Arch: "amd64"}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(Encode(prog))
	if err != nil || fmt.Sprint(got) != fmt.Sprint(prog) {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"", "!!", "AAAA", Encode(prog)[:12]} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) succeeded", bad)
		}
	}
}
