package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// runOnOwnThread runs fn on a goroutine locked to its OS thread, for fn
// to switch that thread into another network namespace. Afterwards it
// switches the thread back and unlocks it. If switching back fails, the
// thread stays locked and the runtime retires it when the goroutine ends,
// so a foreign namespace never leaks into other goroutines. (Never leaving
// a thread locked on purpose matters: if the thread is the main thread,
// the runtime parks it forever instead, and with it a reference that
// keeps the namespace alive.)
func runOnOwnThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("opening current netns: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// createNetNS creates a network namespace and bind-mounts it at path, the
// way `ip netns add` does, so that runc and runsc can join it by path and
// it outlives every process in it. Inside it brings loopback up and
// disables IPv6 (so the kernel neither configures nor accepts any IPv6;
// the host filters it as well, for runtimes with their own network stack).
// It returns a netlink handle whose socket lives in the new namespace.
func createNetNS(path string) (*netlink.Handle, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating netns directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("creating netns file: %w", err)
	}
	f.Close()
	var h *netlink.Handle
	err = runOnOwnThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting netns: %w", err)
		}
		// /proc/sys/net shows the namespace of the thread that opens it.
		for _, p := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
			if err := writeSysctl(p, "1"); err != nil {
				return err
			}
		}
		var err error
		if h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("netlink in netns: %w", err)
		}
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		if err != nil {
			h.Close()
			return fmt.Errorf("setting lo up: %w", err)
		}
		return nil
	})
	if err != nil {
		_ = removeNetNS(path)
		return nil, err
	}
	return h, nil
}

// removeNetNS unmounts and removes a namespace's bind mount. The kernel
// frees the namespace (and the veth end inside it) once no process and no
// other mount holds it. Missing mounts and files are not errors.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing netns %s: %w", path, err)
	}
	return nil
}

// writeSysctl writes a /proc/sys file; a missing file (IPv6 compiled out,
// interface gone) is not an error.
func writeSysctl(path, value string) error {
	err := os.WriteFile(path, []byte(value), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// dumpRetries is how often a netlink dump is retried when the kernel
// reports that the table changed while it was being read.
const dumpRetries = 5

// listLinks lists h's interfaces. A dump that other processes' link
// changes interrupted (netlink.ErrDumpInterrupted, "results may be
// incomplete or inconsistent") is read again: acting on a partial list
// would miss interfaces to reconcile or tear down.
func listLinks(h *netlink.Handle) ([]netlink.Link, error) {
	var err error
	for range dumpRetries {
		var links []netlink.Link
		if links, err = h.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return links, err
		}
	}
	return nil, err
}
