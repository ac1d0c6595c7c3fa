package runc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
)

// DefaultMountDir is where sandbox roots are bind-mounted for runc when
// Config.MountDir is empty.
const DefaultMountDir = "/run/corral-rootfs"

// User namespaces (docs/SECURITY.md, "User namespaces").
//
// Every sandbox runs in a user namespace of its own that maps IDs
// 0..idRange-1 inside to idBase.. on the host, so root in a sandbox is
// host user 2^31, which owns nothing outside sandboxes and has no
// capability on the host. The base keeps clear of the IDs distributions
// hand out to users and to /etc/subuid ranges (below 2^31).
//
// The range is the same for every sandbox because sandbox roots are
// overlayfs mounts that share their template as the lower layer, and the
// template's files carry one set of owners: PrepareTemplate shifts them
// into the range once, when the template is built. A range per sandbox
// would need the template shown through an idmapped mount per sandbox,
// which runc 1.1.5 cannot make and overlayfs cannot be on this kernel
// (mount_setattr(MOUNT_ATTR_IDMAP) fails with EINVAL); it would take
// idmapped layers, made by the storage backend.
//
// Each namespace has its own owner, though: slot n's owner is host user
// ownerBase+n, which runs nothing and owns no file. The kernel charges
// per-user resources (inotify instances and watches, namespaces,
// RLIMIT_NPROC, message queue bytes, pending signals) at every level up
// the namespace tree, at the host level to the namespace's owner; with an
// owner per sandbox, one sandbox cannot use up another's budget or host
// root's (a namespace runc makes is owned by host root).
const (
	idBase    = 1 << 31
	idRange   = 1 << 16
	ownerBase = idBase + idRange
	idSlots   = 1 << 16
)

// rootfsLink is the symlink in a sandbox directory that points to the
// sandbox's bind-mounted root (<MountDir>/<slot>/rootfs): it records which
// slot the sandbox holds.
const rootfsLink = "rootfs"

// A slot is one namespace owner and one mount point, laid out as
//
//	<MountDir>/.lock          flock(2)ed while slots are taken or freed
//	<MountDir>/<n>/           mode 0700, owned by sandbox root (idBase)
//	<MountDir>/<n>/owner      symlink to the sandbox directory holding it
//	<MountDir>/<n>/rootfs     mount point of the root
//
// MountDir is shared by every daemon on the host (each has its own
// sandbox directories), so that no two live sandboxes share an owner. It
// is mode 0711: runc bind-mounts the root onto itself from inside the
// sandbox's user namespace, where every directory on the path must be
// searchable by sandbox root, which the daemon's 0700 state directory is
// not; the 0700 slot directory keeps other host users out.

// ownerID returns the host user that owns slot n's user namespace.
func ownerID(n int) uint32 { return uint32(ownerBase + n) }

func (d *Driver) slotDir(n int) string { return filepath.Join(d.mountDir, strconv.Itoa(n)) }

// lockSlots takes the host-wide slot lock and returns its release.
func (d *Driver) lockSlots() (func(), error) {
	f, err := os.OpenFile(filepath.Join(d.mountDir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening slot lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking slots: %w", err)
	}
	return func() { f.Close() }, nil
}

// allocSlot takes a free slot for the sandbox directory dir, makes its
// mount point, records it in dir, and returns the slot and the mount
// point. A slot whose owner directory no longer exists (its daemon crashed
// before deleting) is reclaimed. Cost: one flock and a handful of file
// operations; the search starts at a hash of dir, so it rarely probes
// more than one slot.
func (d *Driver) allocSlot(dir string) (int, string, error) {
	h := fnv.New32a()
	h.Write([]byte(dir))
	return d.allocSlotFrom(dir, int(h.Sum32()%idSlots))
}

// allocSlotFrom is allocSlot searching from slot start.
func (d *Driver) allocSlotFrom(dir string, start int) (int, string, error) {
	unlock, err := d.lockSlots()
	if err != nil {
		return 0, "", err
	}
	defer unlock()
	for i := range idSlots {
		n := (start + i) % idSlots
		sd := d.slotDir(n)
		err := os.Mkdir(sd, 0o700)
		if errors.Is(err, fs.ErrExist) {
			if !d.slotStale(n) {
				continue
			}
			if err := d.clearSlot(n); err != nil {
				return 0, "", err
			}
			err = os.Mkdir(sd, 0o700)
		}
		if err != nil {
			return 0, "", fmt.Errorf("creating slot %d: %w", n, err)
		}
		mnt := filepath.Join(sd, "rootfs")
		// The owner link last: until it is there the slot is stale (a
		// crash leaves it to the next sweep), and once it is, dir's
		// rootfs link names the slot for Delete to free.
		steps := []func() error{
			func() error { return os.Chown(sd, idBase, idBase) },
			func() error { return os.Mkdir(mnt, 0o755) },
			func() error { return os.Symlink(mnt, filepath.Join(dir, rootfsLink)) },
			func() error { return os.Symlink(dir, filepath.Join(sd, "owner")) },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return 0, "", errors.Join(fmt.Errorf("preparing slot %d: %w", n, err), d.clearSlot(n))
			}
		}
		return n, mnt, nil
	}
	return 0, "", errdefs.Errorf(errdefs.ErrResourceExhausted, "all %d user namespace slots are in use", idSlots)
}

// slotStale reports whether slot n's owner is gone. Called with the lock.
func (d *Driver) slotStale(n int) bool {
	owner, err := os.Readlink(filepath.Join(d.slotDir(n), "owner"))
	if err != nil {
		// Made by a process that died between its mkdir and its
		// symlink: every slot change happens under the lock.
		return true
	}
	_, err = os.Lstat(owner)
	return errors.Is(err, fs.ErrNotExist)
}

// sweepSlots clears every stale slot (slotStale) and returns how many it
// cleared. A daemon killed while it took a slot can leave one half made:
// its sandbox directory, which reconcile removes, never recorded it, and
// an allocation reclaims it only if its search happens to probe it.
func (d *Driver) sweepSlots() (int, error) {
	unlock, err := d.lockSlots()
	if err != nil {
		return 0, err
	}
	defer unlock()
	entries, err := os.ReadDir(d.mountDir)
	if err != nil {
		return 0, fmt.Errorf("listing slots: %w", err)
	}
	cleared := 0
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 0 || n >= idSlots || !e.IsDir() || !d.slotStale(n) {
			continue
		}
		if err := d.clearSlot(n); err != nil {
			return cleared, err
		}
		cleared++
	}
	return cleared, nil
}

// clearSlot unmounts slot n's root and sysfs (netns.go) and removes the
// slot. It removes entries one by one, never recursively: a root still
// mounted must make it fail, not be deleted. Called with the lock.
func (d *Driver) clearSlot(n int) error {
	sd := d.slotDir(n)
	mnt := filepath.Join(sd, "rootfs")
	sys := filepath.Join(sd, "sys")
	for _, m := range []string{mnt, sys} {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", m, err)
		}
	}
	for _, p := range []string{filepath.Join(sd, "owner"), mnt, sys, sd} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing slot %d: %w", n, err)
		}
	}
	return nil
}

// releaseSlot frees the slot recorded in the sandbox directory dir, if
// any, after checking that the slot still belongs to dir.
func (d *Driver) releaseSlot(dir string) error {
	link := filepath.Join(dir, rootfsLink)
	target, err := os.Readlink(link)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading slot link: %w", err)
	}
	rel, err := filepath.Rel(d.mountDir, filepath.Dir(target))
	n, perr := strconv.Atoi(rel)
	if err != nil || perr != nil || n < 0 || n >= idSlots || strings.Contains(rel, "/") {
		return fmt.Errorf("slot link %s points outside %s: %s", link, d.mountDir, target)
	}
	unlock, err := d.lockSlots()
	if err != nil {
		return err
	}
	defer unlock()
	if owner, err := os.Readlink(filepath.Join(d.slotDir(n), "owner")); err == nil && owner != dir {
		// Reclaimed by another sandbox after ours was found stale:
		// ours is gone already.
		return os.Remove(link)
	}
	if err := d.clearSlot(n); err != nil {
		return err
	}
	return os.Remove(link)
}

// bindRoot bind-mounts the root src (with the mounts below it) at dst.
func bindRoot(src, dst string) error { return ocirt.Bind(src, dst) }

// userNS is a new user namespace that maps IDs 0..idRange-1 to idBase..
// and is owned by a host user of its own, held open by fd and by the
// unreaped holder process whose /proc entry Path names. runc joins it by
// path instead of making one, because a namespace runc makes is owned by
// host root (see the constants above).
//
// The owner is whoever creates the namespace, so the holder starts on a
// thread switched to the owner's IDs (asHostID). It makes the namespace
// and exits at once (holder.go); its zombie keeps the namespace reachable
// at /proc/<pid>/ns/user until Close reaps it, and the daemon writes the
// ID maps of the zombie's namespace. Cost: under a millisecond, almost all
// of it the fork and exec.
type userNS struct {
	Fd   int
	Path string
	cmd  *exec.Cmd
}

// newUserNS makes a namespace owned by host user owner. holder is the
// program that makes it (openHolder); when nil, the child is cloned into a
// new namespace and re-executes this binary, through /proc/self/exe
// because a path through directories only root may search would fail to
// exec.
func newUserNS(holder *os.File, owner uint32) (*userNS, error) {
	var cmd *exec.Cmd
	if holder != nil {
		cmd = holderCommand(holder)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	} else {
		cmd = exec.Command("/proc/self/exe", "--corral-userns-holder")
		cmd.Env = []string{}
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, Pdeathsig: syscall.SIGKILL}
	}
	if err := asHostID(owner, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting user namespace holder: %w", err)
	}
	ns := &userNS{Fd: -1, Path: "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user", cmd: cmd}
	if holder != nil {
		// Until it has exited, it may not have made the namespace yet.
		// WNOWAIT leaves the zombie in place.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			ns.Close()
			return nil, fmt.Errorf("waiting for user namespace holder: %w", err)
		}
		if err := checkNewUserNS(ns.Path, exitStatus(&info)); err != nil {
			ns.Close()
			return nil, err
		}
	}
	// "The writing process must have the CAP_SETUID (CAP_SETGID)
	// capability in the parent user namespace" to map more than its own
	// ID: the daemon (host root) writes the maps, not the holder.
	m := fmt.Sprintf("0 %d %d\n", idBase, idRange)
	pid := filepath.Dir(filepath.Dir(ns.Path))
	for _, f := range []string{"uid_map", "gid_map"} {
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

// checkNewUserNS fails if the namespace at path is the daemon's own: the
// holder, which exited with status, could not unshare (its status is the
// errno).
func checkNewUserNS(path string, status int) error {
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

// asHostID runs f on a locked OS thread whose real, effective and file
// system user and group IDs are id. Credentials are per thread in the
// kernel; the raw system calls change only this one (Go's Setuid would
// change every thread). The saved IDs stay 0, so the thread can switch
// back. f must not start goroutines that expect these credentials.
//
// It runs in a goroutine of its own: if the thread cannot get its IDs
// back, the goroutine exits still locked and the runtime destroys the
// thread rather than reuse it.
func asHostID(id uint32, f func() error) error {
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
func (ns *userNS) Close() {
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

// shiftOwners moves the owners of every file under dir with IDs below
// idRange into the sandbox range (ID i becomes idBase+i), so that inside
// a user namespace the files show their original owners. It is
// idempotent: IDs already in the range are left alone. chown clears the
// set-user-ID and set-group-ID bits and drops file capabilities; the mode
// is restored, capabilities are not (no_new_privs ignores them anyway).
// It never follows symlinks. Cost: an lstat and an lchown per file, about
// 10 µs each.
func shiftOwners(dir string) error {
	return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat of %s: no owner", p)
		}
		uid, gid := st.Uid, st.Gid
		if uid < idRange {
			uid += idBase
		}
		if gid < idRange {
			gid += idBase
		}
		if uid == st.Uid && gid == st.Gid {
			return nil
		}
		if err := os.Lchown(p, int(uid), int(gid)); err != nil {
			return fmt.Errorf("shifting owner of %s: %w", p, err)
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 && fi.Mode()&fs.ModeSymlink == 0 {
			if err := os.Chmod(p, fi.Mode()); err != nil {
				return fmt.Errorf("restoring mode of %s: %w", p, err)
			}
		}
		return nil
	})
}

// shifted reports whether the root at rootfs comes from a template whose
// owners PrepareTemplate shifted, judged by the agent's mount point that
// PrepareTemplate makes: sandboxes of templates built before user
// namespaces, or by a daemon without them, run without one.
func shifted(rootfs string) (bool, error) {
	fi, err := os.Lstat(filepath.Join(rootfs, AgentDest))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking template owners: %w", err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid == idBase, nil
}

// RootUserNS returns the ID mapping that a sandbox with the root file
// system rootfs needs: the sandbox ID range when PrepareTemplate shifted
// its template's owners, the zero UserNS otherwise. With a mapping it
// also shifts the owner of the root directory itself, as Create does.
// Other OCI drivers (gVisor) use it to show the same templates with their
// original owners.
func RootUserNS(rootfs string) (UserNS, error) {
	ok, err := shifted(rootfs)
	if err != nil || !ok {
		return UserNS{}, err
	}
	if err := shiftRootDir(rootfs); err != nil {
		return UserNS{}, err
	}
	return UserNS{HostID: idBase, Size: idRange}, nil
}

// shiftRootDir shifts the owner of the root directory itself (see
// shiftOwners).
func shiftRootDir(rootfs string) error {
	fi, err := os.Lstat(rootfs)
	if err != nil {
		return fmt.Errorf("checking root directory owner: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid >= idRange && st.Gid >= idRange {
		return nil
	}
	uid, gid := st.Uid, st.Gid
	if uid < idRange {
		uid += idBase
	}
	if gid < idRange {
		gid += idBase
	}
	if err := os.Lchown(rootfs, int(uid), int(gid)); err != nil {
		return fmt.Errorf("shifting owner of root directory: %w", err)
	}
	return nil
}
