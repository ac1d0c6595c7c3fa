package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// createImage makes a sparse file of size bytes at img holding an empty
// btrfs filesystem. It builds the image under a temporary name and renames
// it into place, so a crash never leaves a file at img without a
// filesystem in it.
func createImage(ctx context.Context, img string, size int64) error {
	tmp := img + ".tmp"
	_ = os.Remove(tmp) // leftover of a crash during a previous attempt
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating image %s: %w", tmp, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sizing image %s: %w", tmp, err)
	}
	// mkfs.btrfs is the one place we use btrfs-progs: writing a filesystem
	// from scratch is not something to redo by hand, and it runs once.
	out, err := exec.CommandContext(ctx, "mkfs.btrfs", "-q", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("making btrfs on %s: %w: %s", tmp, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("renaming image into place: %w", err)
	}
	return nil
}

// loopBackedBy returns the loop device (/dev/loopN) whose backing file is
// img, or "" when there is none. It reads sysfs, so it also finds a device
// that an earlier process attached and that is still alive.
func loopBackedBy(img string) string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == img {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}

// attachLoop binds img to a free loop device with LOOP_CONFIGURE and
// returns the device path and an open handle to it.
//
// The device gets LO_FLAGS_AUTOCLEAR: the kernel detaches it when its last
// user goes away, which is the btrfs mount once the caller has mounted it
// and closed the handle. So unmounting frees the device, and a crash
// between attaching and mounting cannot leak it either. It also gets
// LO_FLAGS_DIRECT_IO so that file data is cached once, in btrfs, and not a
// second time in the page cache of the image file.
func attachLoop(img string) (string, *os.File, error) {
	backing, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("opening image %s: %w", img, err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("opening loop control: %w", err)
	}
	defer ctl.Close()

	// Another process can take the device between GET_FREE and CONFIGURE;
	// CONFIGURE then fails with EBUSY and we ask for another one.
	for range 20 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("finding a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", nil, fmt.Errorf("opening %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], img)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if err == nil {
			return dev, f, nil
		}
		f.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("attaching %s to %s: %w", img, dev, err)
		}
	}
	return "", nil, fmt.Errorf("attaching %s: every free loop device was taken before we could use it", img)
}

// mountImage mounts the btrfs filesystem in img at mnt through a loop
// device. If an earlier process left a loop device attached to img (its
// mount was lazily detached but is still in use), mountImage mounts that
// device again rather than attaching a second one: two devices with the
// same btrfs filesystem would confuse the kernel's device scan.
func mountImage(img, mnt string) error {
	dev := loopBackedBy(img)
	var f *os.File
	if dev == "" {
		var err error
		if dev, f, err = attachLoop(img); err != nil {
			return err
		}
		// Closing the handle after mounting hands the device's lifetime to
		// the mount (autoclear); closing it after a failed mount detaches it.
		defer f.Close()
	}
	if err := unix.Mount(dev, mnt, "btrfs", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mounting %s (%s) at %s: %w", img, dev, mnt, err)
	}
	return nil
}

// waitLoopFreed waits up to timeout until no loop device is backed by img
// and reports whether none is. After the last unmount the kernel detaches
// an autoclear device at once, but not while the filesystem is still mounted elsewhere.
func waitLoopFreed(img string, timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	for {
		dev := loopBackedBy(img)
		if dev == "" {
			return "", true
		}
		if time.Now().After(deadline) {
			return dev, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// detachLoop asks the kernel to detach dev from its backing file. With
// other openers left (a mount still alive in another mount namespace) the
// kernel only marks the device autoclear and detaches it when they go.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detaching %s: %w", dev, err)
	}
	return nil
}
