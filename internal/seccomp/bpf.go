package seccomp

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Compile turns a profile of Profile's shape into the classic BPF program
// that seccomp(2) installs, so that the sandbox's init can install it
// itself (Install) instead of runc compiling the profile with libseccomp
// in `runc init`, which every sandbox's start would wait for.
//
// It takes what Profile makes and refuses anything else: default action
// allow; the native architecture only; rules with action errno whose
// conditions are masked-equal tests, all of which must hold (several
// rules for one call: any). A call name the architecture does not have is
// skipped, as libseccomp does. The program behaves as libseccomp's does:
//
//   - a call through another ABI (another architecture token, or an x32
//     number, 0x40000000 and up, but not -1) kills the process;
//   - a call with rules: the first rule whose conditions hold returns its
//     errno, otherwise it is allowed;
//   - any other call is allowed.
//
// Compile fails on architectures it has no system-call table for.
func Compile(p *specs.LinuxSeccomp) ([]unix.SockFilter, error) {
	if sysNums == nil {
		return nil, errors.New("seccomp: no system-call table for this architecture")
	}
	if p.DefaultAction != specs.ActAllow {
		return nil, fmt.Errorf("seccomp: default action %s, want %s", p.DefaultAction, specs.ActAllow)
	}
	if !slices.Equal(p.Architectures, []specs.Arch{nativeArch}) {
		return nil, fmt.Errorf("seccomp: architectures %v, want only %s", p.Architectures, nativeArch)
	}
	rules, err := rulesByNumber(p.Syscalls)
	if err != nil {
		return nil, err
	}
	nrs := slices.Sorted(maps.Keys(rules))
	// A search over the numbers with rules, whose leaves jump to each
	// number's rule block, which follow it: an allowed call, by far the
	// most common, runs a few compares (logarithmic in the count) instead
	// of one compare per number with rules. (Linux caches the answer for
	// calls that are always allowed; gVisor runs the filter on every call.)
	tree, jumps, err := searchTree(nrs)
	if err != nil {
		return nil, err
	}
	prog := abiCheck()
	base := len(prog)
	prog = append(prog, tree...)
	prog = appendRuleBlocks(prog, base, jumps, nrs, rules)
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program of %d instructions, more than %d", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// rulesByNumber checks that every rule is one Compile supports and groups
// the rules by system-call number, each call's in the profile's order.
func rulesByNumber(syscalls []specs.LinuxSyscall) (map[int][]specs.LinuxSyscall, error) {
	rules := map[int][]specs.LinuxSyscall{}
	for _, s := range syscalls {
		if s.Action != specs.ActErrno || s.ErrnoRet == nil || *s.ErrnoRet > unix.SECCOMP_RET_DATA {
			return nil, fmt.Errorf("seccomp: rule for %v: want action %s with an errno", s.Names, specs.ActErrno)
		}
		for _, a := range s.Args {
			if a.Op != specs.OpMaskedEqual || a.Index > 5 {
				return nil, fmt.Errorf("seccomp: rule for %v: condition %s on argument %d not supported", s.Names, a.Op, a.Index)
			}
		}
		for _, name := range s.Names {
			nr, ok := sysNums[name]
			if !ok {
				return nil, fmt.Errorf("seccomp: unknown system call %q", name)
			}
			if nr >= 0 {
				rules[nr] = append(rules[nr], s)
			}
		}
	}
	return rules, nil
}

// abiCheck is the program's start: it kills a call made through another
// ABI and leaves the call's number loaded.
func abiCheck() []unix.SockFilter {
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
		kill  = unix.SECCOMP_RET_KILL_PROCESS
	)
	prog := []unix.SockFilter{
		{Code: ldAbs, K: 4}, // seccomp_data.arch
		{Code: jeq, K: auditArch, Jt: 1},
		{Code: ret, K: kill},
		{Code: ldAbs, K: 0}, // seccomp_data.nr
	}
	if x32Bit != 0 {
		// Number -1 is no call (tracers use it to skip one) and is
		// allowed to fail with ENOSYS, as libseccomp does.
		prog = append(prog,
			unix.SockFilter{Code: jge, K: x32Bit, Jf: 2},
			unix.SockFilter{Code: jeq, K: 0xffffffff, Jt: 1},
			unix.SockFilter{Code: ret, K: kill},
		)
	}
	return prog
}

// appendRuleBlocks lays out the rule block of every number in nrs after
// prog, whose search tree starts at base, and points the tree's jumps at
// them. Numbers with the same rules share one block (most are a plain
// EPERM): a shorter program is cheaper for gVisor to take, which
// optimizes it and runs it once per number on every install.
func appendRuleBlocks(prog []unix.SockFilter, base int, jumps []blockJump, nrs []int, rules map[int][]specs.LinuxSyscall) []unix.SockFilter {
	blockAt := map[int]int{}
	shared := map[string]int{}
	for _, nr := range nrs {
		block := ruleBlock(rules[nr])
		key := Encode(block)
		at, ok := shared[key]
		if !ok {
			at = len(prog)
			shared[key] = at
			prog = append(prog, block...)
		}
		blockAt[nr] = at
	}
	for _, j := range jumps {
		at := base + j.at
		prog[at].K = uint32(blockAt[j.nr] - (at + 1))
	}
	return prog
}

// leafSize is the most numbers a leaf of searchTree compares one by one.
const leafSize = 4

// blockJump is an unconditional jump at index at of a searchTree to the
// rule block of number nr, to be pointed at it once the blocks are laid
// out after the tree.
type blockJump struct{ at, nr int }

// searchTree returns code that, with a call's number loaded, finds it
// among nrs (sorted) by halving: each leaf compares up to leafSize
// numbers and jumps (BPF_JA, whose offset has 32 bits) to the matching
// number's block, or allows the call. Conditional jumps have 8-bit
// offsets; a tree too large for them is an error.
func searchTree(nrs []int) ([]unix.SockFilter, []blockJump, error) {
	if len(nrs) <= leafSize {
		var out []unix.SockFilter
		var jumps []blockJump
		for _, nr := range nrs {
			out = append(out, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: uint32(nr), Jt: 0, Jf: 1})
			jumps = append(jumps, blockJump{at: len(out), nr: nr})
			out = append(out, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JA})
		}
		return append(out, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW}), jumps, nil
	}
	mid := len(nrs) / 2
	left, leftJumps, err := searchTree(nrs[:mid])
	if err != nil {
		return nil, nil, err
	}
	right, rightJumps, err := searchTree(nrs[mid:])
	if err != nil {
		return nil, nil, err
	}
	if len(left) > 255 {
		return nil, nil, fmt.Errorf("seccomp: too many system calls with rules (%d) for one program", len(nrs))
	}
	out := []unix.SockFilter{{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: uint32(nrs[mid]), Jt: uint8(len(left)), Jf: 0}}
	out = append(out, left...)
	jumps := leftJumps
	for i := range jumps {
		jumps[i].at++
	}
	for _, j := range rightJumps {
		jumps = append(jumps, blockJump{at: j.at + len(out), nr: j.nr})
	}
	return append(out, right...), jumps, nil
}

// ruleBlock is the code for one call's rules, entered with its number
// loaded: each rule tests its conditions, the accumulator holding one
// 32-bit half of an argument at a time, and returns its errno if all
// hold; a failed test jumps to the next rule; after the last, allow.
func ruleBlock(rules []specs.LinuxSyscall) []unix.SockFilter {
	var out []unix.SockFilter
	for _, r := range rules {
		// The tests of this rule, each a load, a mask and a compare
		// whose false branch leaves the rule.
		type test struct{ off, mask, value uint32 }
		var tests []test
		for _, a := range r.Args {
			off := uint32(16 + 8*a.Index) // args[i], little-endian: low half first
			tests = append(tests, test{off, uint32(a.Value), uint32(a.ValueTwo)})
			if a.Value>>32 != 0 || a.ValueTwo>>32 != 0 {
				tests = append(tests, test{off + 4, uint32(a.Value >> 32), uint32(a.ValueTwo >> 32)})
			}
		}
		n := len(tests)
		for i, t := range tests {
			// After this compare: the remaining tests (3 each) and
			// the rule's return lie between it and the next rule.
			skip := uint8(3*(n-1-i) + 1)
			out = append(out,
				unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: t.off},
				unix.SockFilter{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: t.mask},
				unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: t.value, Jt: 0, Jf: skip},
			)
		}
		out = append(out, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(*r.ErrnoRet)})
	}
	return append(out, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW})
}

// Encode and Decode carry a program on a command line: base64 of its
// instructions, 8 bytes each (code, jt, jf, k; little-endian).
func Encode(prog []unix.SockFilter) string {
	b := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		b = binary.LittleEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.LittleEndian.AppendUint32(b, f.K)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Decode reverses Encode.
func Decode(s string) ([]unix.SockFilter, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) == 0 || len(b)%8 != 0 || len(b)/8 > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: malformed program (%d bytes): %v", len(b), err)
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		c := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(c), Jt: c[2], Jf: c[3], K: binary.LittleEndian.Uint32(c[4:])}
	}
	return prog, nil
}

// Install installs prog as a seccomp filter on every thread of the calling
// process (SECCOMP_FILTER_FLAG_TSYNC) and on all it starts from then on.
// The process must have no_new_privs set (runc sets it for the sandbox's
// init) or CAP_SYS_ADMIN.
func Install(prog []unix.SockFilter) error {
	return install(prog, unix.SECCOMP_FILTER_FLAG_TSYNC)
}

// InstallThread installs prog as a seccomp filter on the calling OS thread
// alone, which the caller must have locked (runtime.LockOSThread), and on
// every process and thread it creates from then on. Under Linux the
// thread must have no_new_privs set (runc sets it for the sandbox's init,
// whose threads inherit it) or CAP_SYS_ADMIN; gVisor takes it as set.
func InstallThread(prog []unix.SockFilter) error {
	return install(prog, 0)
}

func install(prog []unix.SockFilter, flags uintptr) error {
	if len(prog) == 0 {
		return errors.New("installing seccomp filter: empty program")
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("installing seccomp filter: %w", errno)
	}
	if r != 0 {
		// With TSYNC, a positive result is the ID of a thread that
		// could not be synchronized.
		return fmt.Errorf("installing seccomp filter: thread %d could not take it", r)
	}
	return nil
}
