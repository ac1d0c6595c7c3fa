package runc

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/driver"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/userns"
)

// DefaultMountDir is where sandbox roots are bind-mounted for runc when
// Config.MountDir is empty.
const DefaultMountDir = "/run/corral-rootfs"

// User namespaces (docs/SECURITY.md, "User namespaces").
//
// Every sandbox runs in a user namespace of its own. On disk, templates
// and roots keep sandbox ID i as host ID idBase+i (driver.StoredIDBase):
// PrepareTemplate shifts a template's owners into that stored range once,
// when the template is built. A sandbox whose range the Manager reserved
// (ReserveIDs, before storage made its root) runs under host IDs of its
// own, slot n's range rangeBase(n).. (idrange.go): its root's layers are
// ID-mapped mounts that show the stored range as that range (overlayfs
// takes ID-mapped layers, not an ID-mapped overlay), so another sandbox's
// files are nobody's from its point of view, on disk and through their
// mounts alike. A sandbox created without a reservation runs in the
// stored range itself. The slot table is host-wide and can be lent to
// another driver (IDSlots), so that its sandboxes and runc's never share
// a range. Every range lies above 2^31, clear of the IDs
// distributions hand out to users and to /etc/subuid ranges, and its
// root has no capability on the host.
//
// Each namespace also has its own owner: slot n's owner is host user
// ownerBase+n, which runs nothing and owns no file. The kernel charges
// per-user resources (inotify instances and watches, namespaces,
// RLIMIT_NPROC, message queue bytes, pending signals) at every level up
// the namespace tree, at the host level to the namespace's owner; with an
// owner per sandbox, one sandbox cannot use up another's budget or host
// root's (a namespace runc makes is owned by host root).
const (
	idBase    = driver.StoredIDBase
	idRange   = driver.StoredIDSize
	ownerBase = idBase + idRange
	// idSlots ranges of idRange fit above the stored range and the
	// owners (which take one range's worth) below 2^32-1, which is no ID
	// ((uid_t)-1).
	idSlots = 1<<15 - 4
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
				// Left for the next sweep to report; the search goes on.
				d.log.Warn("stale user namespace slot kept", "slot", n, "error", err)
				continue
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
	// A slot that cannot be cleared (a root still mounted in a way
	// unmount refuses, or entries nobody expects) stays, reported; it
	// must not keep the sweep from the others.
	cleared := 0
	var errs []error
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 0 || n >= idSlots || !e.IsDir() || !d.slotStale(n) {
			continue
		}
		if err := d.clearSlot(n); err != nil {
			errs = append(errs, err)
			continue
		}
		cleared++
	}
	return cleared, errors.Join(errs...)
}

// clearSlot unmounts slot n's root and sysfs (netns.go) and removes the
// slot, with a half-done owner change (repoint). It removes entries one
// by one, never recursively: a root still mounted must make it fail, not
// be deleted. Called with the lock.
func (d *Driver) clearSlot(n int) error {
	sd := d.slotDir(n)
	mnt := filepath.Join(sd, "rootfs")
	sys := filepath.Join(sd, "sys")
	for _, m := range []string{mnt, sys} {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", m, err)
		}
	}
	// owner.new is repoint's: a daemon killed between its symlink and its
	// rename leaves it.
	for _, p := range []string{filepath.Join(sd, "owner"), filepath.Join(sd, "owner.new"), mnt, sys, sd} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing slot %d: %w%s", n, err, dirEntries(p))
		}
	}
	return nil
}

// dirEntries names up to eight entries of the directory dir, for an error
// that says what kept it from being removed; "" when dir lists none.
func dirEntries(dir string) string {
	f, err := os.Open(dir)
	if err != nil {
		return ""
	}
	defer f.Close()
	names, _ := f.Readdirnames(8)
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf(" (holds %s)", strings.Join(names, ", "))
}

// releaseSlot frees the slot recorded in the sandbox directory dir, if
// any, after checking that the slot still belongs to dir.
func (d *Driver) releaseSlot(dir string) error {
	link := filepath.Join(dir, rootfsLink)
	n, _, err := d.linkedSlot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
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

// linkedSlot returns the slot that the sandbox directory dir records and
// the slot's mount point; an error wrapping fs.ErrNotExist when it records
// none.
func (d *Driver) linkedSlot(dir string) (int, string, error) {
	link := filepath.Join(dir, rootfsLink)
	target, err := os.Readlink(link)
	if err != nil {
		return 0, "", fmt.Errorf("reading slot link: %w", err)
	}
	rel, err := filepath.Rel(d.mountDir, filepath.Dir(target))
	n, perr := strconv.Atoi(rel)
	if err != nil || perr != nil || n < 0 || n >= idSlots || strings.Contains(rel, "/") {
		return 0, "", fmt.Errorf("slot link %s points outside %s: %s", link, d.mountDir, target)
	}
	return n, target, nil
}

// bindRoot bind-mounts the root src (with the mounts below it) at dst.
func bindRoot(src, dst string) error { return ocirt.Bind(src, dst) }

// userNS is a user namespace held open for runc, which joins it by path
// instead of making one, because a namespace runc makes is owned by host
// root (see the constants above).
type userNS = userns.NS

// newUserNS makes a namespace owned by host user owner, with idMap (lines
// of uid_map(5)) as its user and group ID maps.
func newUserNS(h *userns.Holder, owner uint32, idMap string) (*userNS, error) {
	return h.New(owner, idMap, idMap)
}

// shiftOwners moves the owners of every file under dir with IDs below
// idRange into the sandbox range (ID i becomes idBase+i), so that inside
// a user namespace the files show their original owners. It is
// idempotent: IDs already in the range are left alone. chown clears the
// set-user-ID and set-group-ID bits and drops file capabilities; the mode
// is restored, capabilities are not (no_new_privs ignores them anyway).
// It never follows symlinks. Cost: an lstat and an lchown per file.
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

// rootBase returns the host ID that root of a sandbox on rootfs runs as,
// judged by the owner of the agent's mount point that PrepareTemplate
// makes: idBase for a root shown in the stored range, a slot's
// rangeBase for one whose layers show it in that slot's range. It returns
// false for sandboxes of templates built before user namespaces, or by a
// daemon without them, which run without one.
func rootBase(rootfs string) (uint32, bool, error) {
	fi, err := os.Lstat(filepath.Join(rootfs, AgentDest))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("checking template owners: %w", err)
	}
	uid := fi.Sys().(*syscall.Stat_t).Uid
	if _, ok := rangeSlot(uid); ok || uid == idBase {
		return uid, true, nil
	}
	return 0, false, nil
}

// shifted reports whether the root at rootfs comes from a template whose
// owners PrepareTemplate shifted (rootBase).
func shifted(rootfs string) (bool, error) {
	_, ok, err := rootBase(rootfs)
	return ok, err
}

// RootUserNS returns the ID mapping that a sandbox with the root file
// system rootfs needs: its range (rootBase) when PrepareTemplate shifted
// its template's owners, the zero UserNS otherwise. With a mapping it
// also shifts the owner of the root directory itself, as Create does.
// Other OCI drivers (gVisor) use it to show the same templates with their
// original owners.
func RootUserNS(rootfs string) (UserNS, error) {
	base, ok, err := rootBase(rootfs)
	if err != nil || !ok {
		return UserNS{}, err
	}
	if err := shiftRootDir(rootfs); err != nil {
		return UserNS{}, err
	}
	return UserNS{HostID: base, Size: idRange}, nil
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
