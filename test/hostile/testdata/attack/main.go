// Command attack is the hostile workload of test/hostile: a static binary
// copied into a sandbox that tries what an escape or a noisy neighbour would
// try and prints, one line per probe, "<probe> ok" when the call succeeded
// or "<probe> <ERRNO>" when it failed. It never does anything that would
// harm a host if it succeeded: every probe targets objects it creates
// itself, inside the sandbox's own namespaces. The test reads the lines;
// the exit code is always 0 unless the arguments are wrong.
//
//	attack probes [daemon-pid]   every system-call probe
//	attack unshare user|mount|net  one unshare (probes runs it in a child)
//	attack abis                  getpid through each compat ABI (also outside a sandbox)
//	attack compat i386|x32       one getpid through another ABI (abis runs it in a child)
//	attack fork N                start N sleeping children
//	attack alloc MiB             allocate and touch memory
//	attack inotify N             create N inotify instances, hold them
//	attack find SECRET DIR...    search files under DIR for SECRET
//	attack connect PATH...       connect to unix sockets
//	attack tcp ADDR              connect over TCP
//
// It builds for amd64 only: some probes are of x86's own calls and ABIs.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// In `attack compat` the main goroutine runs on the process's first
// thread, which compatProbe relies on ("calling LockOSThread from an init
// function will cause the main function to be invoked on that thread").
// Only there: a locked main thread costs every process a thread more, and
// `attack fork` counts against a pids limit.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "compat" {
		runtime.LockOSThread()
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack probes|fork|alloc|inotify|find|connect|tcp ...")
		os.Exit(2)
	}
	// Some probes would change the machine if they succeeded outside a
	// container (the hostname, Ctrl-Alt-Del): refuse to run unless the
	// caller says this is a sandbox. The ABI probes only call getpid, and
	// run on the host too, to learn what its kernel offers.
	harmless := os.Args[1] == "abis" || os.Args[1] == "compat"
	if os.Getenv("CORRAL_ATTACK_SANDBOXED") != "1" && !harmless {
		fmt.Fprintln(os.Stderr, "attack: refusing to run outside a sandbox (set CORRAL_ATTACK_SANDBOXED=1)")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "probes":
		probes(args)
	case "fork":
		forkN(atoi(args[0]))
	case "alloc":
		alloc(atoi(args[0]))
	case "inotify":
		inotify(atoi(args[0]))
	case "find":
		find(args[0], args[1:])
	case "connect":
		for _, p := range args {
			c, err := net.Dial("unix", p)
			if err == nil {
				c.Close()
			}
			report("connect "+p, err)
		}
	case "tcp":
		c, err := net.DialTimeout("tcp", args[0], time.Second)
		if err == nil {
			c.Close()
		}
		report("tcp "+args[0], err)
	case "sleep":
		time.Sleep(time.Hour)
	case "abis":
		abiProbes()
	case "compat":
		compatCall(args[0])
	case "unshare":
		flags := map[string]int{"user": unix.CLONE_NEWUSER, "mount": unix.CLONE_NEWNS, "net": unix.CLONE_NEWNET}
		report("unshare-"+args[0], unix.Unshare(flags[args[0]]))
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return n
}

// report prints the probe's outcome: ok, or the errno's name.
func report(name string, err error) {
	if err == nil {
		fmt.Println(name, "ok")
		return
	}
	if err == errKilled {
		fmt.Println(name, err)
		return
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		fmt.Println(name, unix.ErrnoName(errno))
		return
	}
	fmt.Println(name, "error:", err)
}

func errnoOf(r1 uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	if int(r1) >= 0 {
		unix.Close(int(r1)) // a new fd: leave nothing open
	}
	return nil
}

func probes(args []string) {
	// ptrace: the daemon's pid (names nothing on the host from inside a
	// pid namespace), the sandbox's init, and a child of our own.
	if len(args) > 0 {
		report("ptrace-daemon", unix.PtraceAttach(atoi(args[0])))
	}
	report("ptrace-init", unix.PtraceAttach(1))
	child := exec.Command("/proc/self/exe", "sleep")
	if err := child.Start(); err == nil {
		report("ptrace-child", unix.PtraceAttach(child.Process.Pid))
		child.Process.Kill()
		child.Wait()
	} else {
		report("ptrace-child", err)
	}
	report("process_vm_readv", func() error {
		_, err := unix.ProcessVMReadv(1, []unix.Iovec{{Base: new(byte), Len: 1}}, []unix.RemoteIovec{{Base: 0x400000, Len: 1}}, 0)
		return err
	}())

	// Namespaces: a user namespace is the door to every other kind. Each
	// unshare runs in a child: where it succeeds it would change the
	// namespaces the later probes run in.
	for _, ns := range []string{"user", "mount", "net"} {
		out, err := exec.Command("/proc/self/exe", "unshare", ns).Output()
		if err != nil {
			report("unshare-"+ns, err)
			continue
		}
		fmt.Print(string(out))
	}
	abiProbes()
	cmd := exec.Command("/proc/self/exe", "fork", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	report("clone-newuser", cmd.Run())
	// clone3 with an empty argument: seccomp answers before the kernel
	// looks at it; without the filter the kernel says EINVAL.
	_, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	report("clone3", errnoOf(0, e))
	if fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		report("setns", unix.Setns(fd, unix.CLONE_NEWNET))
		unix.Close(fd)
	} else {
		report("setns", err)
	}

	// Mounts, old and new API, on a directory of our own. pivot_root
	// comes after the unmount, when dir is no mount point: it can then
	// only fail.
	dir, _ := os.MkdirTemp("", "mnt")
	report("mount", unix.Mount("tmpfs", dir, "tmpfs", 0, ""))
	report("umount2", unix.Unmount(dir, unix.MNT_DETACH))
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	report("fsopen", err)
	report("pivot_root", unix.PivotRoot(dir, dir))
	os.Remove(dir)

	// Kernel modules: an empty module image. The kernel would answer
	// ENOEXEC or ENOSYS (no module support); seccomp answers EPERM.
	if f, err := os.Open("/dev/null"); err == nil {
		report("finit_module", unix.FinitModule(int(f.Fd()), "", 0))
		f.Close()
	}
	report("init_module", unix.InitModule([]byte{0}, ""))
	report("delete_module", unix.DeleteModule("corral_no_such_module", 0))
	_, _, e = unix.Syscall6(unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0, 0)
	report("kexec_file_load", errnoOf(0, e))

	// Kernel surfaces: keyrings, eBPF, perf, userfaultfd, io_uring.
	_, err = unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
	report("keyctl", err)
	_, err = unix.AddKey("user", "corral-probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	report("add_key", err)
	attr := [20]uint32{unix.BPF_MAP_TYPE_ARRAY, 4, 4, 1}
	r1, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	report("bpf", errnoOf(r1, e))
	pattr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
	pfd, err := unix.PerfEventOpen(&pattr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		unix.Close(pfd)
	}
	report("perf_event_open", err)
	r1, _, e = unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
	report("userfaultfd", errnoOf(r1, e))
	var params [120]byte
	r1, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	report("io_uring_setup", errnoOf(r1, e))
	var handle [136]byte
	binaryPut32(handle[:], 128)
	var mount int32
	cwd := unix.AT_FDCWD
	root := []byte("/\x00")
	_, _, e = unix.Syscall6(unix.SYS_NAME_TO_HANDLE_AT, uintptr(cwd), uintptr(unsafe.Pointer(&root[0])),
		uintptr(unsafe.Pointer(&handle)), uintptr(unsafe.Pointer(&mount)), 0, 0)
	report("name_to_handle_at", errnoOf(0, e))
	r1, _, e = unix.Syscall6(unix.SYS_OPEN_BY_HANDLE_AT, uintptr(cwd), uintptr(unsafe.Pointer(&handle)), unix.O_RDONLY, 0, 0, 0)
	report("open_by_handle_at", errnoOf(r1, e))

	// Raw and packet sockets (CAP_NET_RAW).
	for _, s := range []struct {
		name        string
		family, typ int
		proto       int
	}{
		{"socket-packet", unix.AF_PACKET, unix.SOCK_RAW, 0x0300},
		{"socket-raw-icmp", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
	} {
		fd, err := unix.Socket(s.family, s.typ|unix.SOCK_CLOEXEC, s.proto)
		if err == nil {
			unix.Close(fd)
		}
		report(s.name, err)
	}

	// Device nodes (a dropped capability).
	report("mknod", unix.Mknod("/tmp/corral-probe-dev", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	os.Remove("/tmp/corral-probe-dev")

	// Terminal input injection: seccomp answers before the kernel checks
	// that fd 0 is a terminal (ENOTTY otherwise).
	c := byte('x')
	_, _, e = unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	report("tiocsti", errnoOf(0, e))
	// A nested btrfs subvolume would escape the root's disk quota.
	var volArgs [4096]byte
	copy(volArgs[8:], "corral-probe-subvol")
	if f, err := os.Open("/tmp"); err == nil {
		_, _, e = unix.Syscall(unix.SYS_IOCTL, f.Fd(), 0x5000940e, uintptr(unsafe.Pointer(&volArgs)))
		report("btrfs-subvol-create", errnoOf(0, e))
		f.Close()
		os.Remove("/tmp/corral-probe-subvol")
	}

	// ASLR off through personality; the host clock; the kernel log.
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0x0040000, 0, 0)
	report("personality", errnoOf(0, e))
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	report("personality-query", errnoOf(0, e))
	var tx unix.Timex
	_, err = unix.Adjtimex(&tx)
	report("adjtimex", err)
	report("syslog", func() error { _, err := unix.Klogctl(3, make([]byte, 64)); return err }())
	_, _, e = unix.Syscall(unix.SYS_IOPL, 3, 0, 0)
	report("iopl", errnoOf(0, e))
	swap := []byte("/tmp/corral-no-swap\x00")
	_, _, e = unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(&swap[0])), 0, 0)
	report("swapoff", errnoOf(0, e))
	report("reboot", unix.Reboot(0)) // LINUX_REBOOT_CMD_CAD_OFF: harmless if allowed

	// /proc/sys and the OOM score.
	report("write-proc-sys-hostname", os.WriteFile("/proc/sys/kernel/hostname", []byte("pwned"), 0))
	report("write-sysrq-trigger", os.WriteFile("/proc/sysrq-trigger", []byte("h"), 0))
	report("lower-oom-score", os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0))
	report("sethostname", unix.Sethostname([]byte("pwned")))
	// Last: where it succeeds it changes this process's root.
	report("chroot", unix.Chroot("/tmp"))
}

func binaryPut32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// forkN starts n children that sleep, reporting how many started.
func forkN(n int) {
	started := 0
	var err error
	for range n {
		cmd := exec.Command("/proc/self/exe", "sleep")
		if err = cmd.Start(); err != nil {
			break
		}
		started++
	}
	fmt.Println("started", started)
	report("fork", err)
}

// alloc allocates and touches mib MiB, reporting progress every 16 MiB.
func alloc(mib int) {
	var keep [][]byte
	for i := range mib {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
		if (i+1)%16 == 0 {
			fmt.Println("allocated", i+1)
		}
	}
	fmt.Println("alloc ok", len(keep))
}

// inotify creates n inotify instances and holds them for a while.
func inotify(n int) {
	made := 0
	var err error
	for range n {
		if _, err = unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
			break
		}
		made++
	}
	fmt.Println("inotify instances", made)
	report("inotify", err)
	time.Sleep(3 * time.Second)
}

// find reports every regular file under roots whose content holds secret,
// and any error that stopped the walk of a root.
func find(secret string, roots []string) {
	found := 0
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err == nil && bytes.Contains(b, []byte(secret)) {
				fmt.Println("found", p)
				found++
			}
			return nil
		})
		if err != nil {
			report("walk "+root, err)
		}
	}
	fmt.Println("found total", found)
}

// abiProbes makes getpid through each compat ABI: i386 through int 0x80,
// x32 through syscall with the x32 bit set.
func abiProbes() {
	for _, abi := range []string{"i386", "x32"} {
		report(abi+"-abi", compatProbe(abi))
	}
}

// compatProbe runs `attack compat abi` in a child and reports how its
// system call ended: nil when it returned, the errno it returned, or
// errKilled when the call killed the thread making it. The child's main
// goroutine runs on its first thread (init), and a Go program whose first
// thread is killed stays a zombie leader while its other threads live on,
// so the child is watched through /proc rather than waited for: once it
// is a zombie, either it exited after printing its answer or its thread
// was killed before it could print anything.
func compatProbe(abi string) error {
	cmd := exec.Command("/proc/self/exe", "compat", abi)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return err
		}
		// "pid (comm) S ...": the state follows the last parenthesis.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the call neither returned nor was killed")
		}
	}
	cmd.Process.Kill() // the threads left behind a killed leader
	answer, err := io.ReadAll(out)
	if err != nil {
		return err
	}
	switch r := string(bytes.TrimSpace(answer)); r {
	case "":
		return errKilled
	case "0":
		return nil
	default:
		return syscall.Errno(atoi(r))
	}
}

var errKilled = errors.New("killed")

// compatCall makes getpid through abi and prints 0 when it returned a
// pid, the errno when it failed.
func compatCall(abi string) {
	var r int64
	switch abi {
	case "i386":
		r = int64(i386Getpid())
	case "x32":
		// x32 numbers are x86-64's with bit 30 set.
		pid, _, e := syscall.RawSyscall(0x40000000|unix.SYS_GETPID, 0, 0, 0)
		r = int64(pid)
		if e != 0 {
			r = -int64(e)
		}
	}
	if r > 0 {
		fmt.Println(0)
	} else {
		fmt.Println(-r)
	}
}
