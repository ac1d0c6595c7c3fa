package userns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NS is a new user namespace with the ID maps it was made with, owned by
// a host user, held open by Fd and by the unreaped holder process whose
// /proc entry Path names.
//
// The owner is whoever creates the namespace, so the holder starts on a
// thread switched to the owner's IDs (AsHostID). It makes the namespace
// and exits at once (holder.go); its zombie keeps the namespace reachable
// at /proc/<pid>/ns/user until Close reaps it, and the daemon writes the
// ID maps of the zombie's namespace. Cost: under a millisecond, almost all
// of it the fork and exec.
type NS struct {
	Fd   int
	Path string
	cmd  *exec.Cmd
}

// New makes a namespace owned by host user owner, with uidMap and gidMap
// (lines of uid_map(5)) as its ID maps. A nil h has no holder program:
// the child is then cloned into a new namespace and re-executes this
// binary, through /proc/self/exe because a path through directories only
// root may search would fail to exec.
func (h *Holder) New(owner uint32, uidMap, gidMap string) (*NS, error) {
	var cmd *exec.Cmd
	holder := h != nil
	if holder {
		cmd = holderCommand(h.prog)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	} else {
		cmd = exec.Command("/proc/self/exe", "--corral-userns-holder")
		cmd.Env = []string{}
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, Pdeathsig: syscall.SIGKILL}
	}
	if err := AsHostID(owner, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting user namespace holder: %w", err)
	}
	ns := &NS{Fd: -1, Path: "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user", cmd: cmd}
	if holder {
		// Until it has exited, it may not have made the namespace yet.
		// WNOWAIT leaves the zombie in place.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			ns.Close()
			return nil, fmt.Errorf("waiting for user namespace holder: %w", err)
		}
		if err := checkNew(ns.Path, exitStatus(&info)); err != nil {
			ns.Close()
			return nil, err
		}
	}
	// "The writing process must have the CAP_SETUID (CAP_SETGID)
	// capability in the parent user namespace" to map more than its own
	// ID: the daemon (host root) writes the maps, not the holder.
	pid := filepath.Dir(filepath.Dir(ns.Path))
	for f, m := range map[string]string{"uid_map": uidMap, "gid_map": gidMap} {
		if err := os.WriteFile(filepath.Join(pid, f), []byte(m), 0); err != nil {
			ns.Close()
			return nil, fmt.Errorf("writing %s of user namespace: %w", f, err)
		}
	}
	fd, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("opening user namespace: %w", err)
	}
	ns.Fd = fd
	return ns, nil
}

// exitStatus is si_status of a CLD_EXITED siginfo from waitid: the exit
// code. (x/sys/unix leaves the union of siginfo_t unnamed; si_status sits
// at byte 24 on Linux.)
func exitStatus(info *unix.Siginfo) int {
	b := (*[unsafe.Sizeof(*info)]byte)(unsafe.Pointer(info))
	return int(int32(binary.NativeEndian.Uint32(b[24:28])))
}

// checkNew fails if the namespace at path is the daemon's own: the
// holder, which exited with status, could not unshare (its status is the
// errno).
func checkNew(path string, status int) error {
	var ours, theirs unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &ours); err != nil {
		return fmt.Errorf("checking user namespace: %w", err)
	}
	if err := unix.Stat(path, &theirs); err != nil {
		return fmt.Errorf("checking user namespace: %w", err)
	}
	if ours.Ino == theirs.Ino && ours.Dev == theirs.Dev {
		return fmt.Errorf("the user namespace holder could not make a namespace: unshare: %w", syscall.Errno(status))
	}
	return nil
}

// AsHostID runs f on a locked OS thread whose real, effective and file
// system user and group IDs are id. Credentials are per thread in the
// kernel; the raw system calls change only this one (Go's Setuid would
// change every thread). The saved IDs stay 0, so the thread can switch
// back. f must not start goroutines that expect these credentials.
//
// It runs in a goroutine of its own: if the thread cannot get its IDs
// back, the goroutine exits still locked and the runtime destroys the
// thread rather than reuse it.
func AsHostID(id uint32, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		keep := uintptr(0) // saved ID: 0
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(id), uintptr(id), keep); e != 0 {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("switching thread to gid %d: %w", id, e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(id), uintptr(id), keep); e != 0 {
			errc <- fmt.Errorf("switching thread to uid %d: %w", id, e)
			return // gid changed: do not reuse the thread
		}
		err := f()
		// The order matters: back to uid 0 first, which restores the
		// effective capabilities (CAP_SETGID) needed for the gid.
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0); e != 0 {
			errc <- errors.Join(err, fmt.Errorf("switching thread back to uid 0: %w", e))
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, 0, 0, 0); e != 0 {
			errc <- errors.Join(err, fmt.Errorf("switching thread back to gid 0: %w", e))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Close reaps the holder and closes the fd; the namespace lives on as
// long as processes (the sandbox) or mounts (its idmapped root) use it.
func (ns *NS) Close() {
	if ns.Fd >= 0 {
		unix.Close(ns.Fd)
		ns.Fd = -1
	}
	if ns.cmd != nil {
		_ = ns.cmd.Process.Kill()
		_ = ns.cmd.Wait()
		ns.cmd = nil
	}
}
