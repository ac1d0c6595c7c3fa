// Package nettest builds what network and egress tests need: network
// namespaces held by file descriptors, a way to run code and open sockets
// inside them, a test upstream DNS resolver, certificates, and a test
// "internet" (a namespace with HTTP and HTTPS servers reachable through a
// veth and a route to the benchmarking range 198.18.0.0/15). Nothing here
// talks to an address outside loopback and the namespaces it creates.
package nettest

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is a network namespace held open by a file descriptor.
type NS struct {
	f *os.File
}

// NewNS creates an anonymous network namespace with its loopback up. It is
// released when the test ends.
func NewNS(t testing.TB) *NS {
	t.Helper()
	var f *os.File
	err := RunLocked(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		var err error
		if f, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	ns := &NS{f: f}
	t.Cleanup(func() { f.Close() })
	return ns
}

// OpenNS opens the namespace bound at path (such as network.Sandbox's
// NetNSPath) until the test ends.
func OpenNS(t testing.TB, path string) *NS {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening netns %s: %v", path, err)
	}
	t.Cleanup(func() { f.Close() })
	return &NS{f: f}
}

// Fd returns the namespace's file descriptor.
func (ns *NS) Fd() int { return int(ns.f.Fd()) }

// RunLocked runs fn on a goroutine locked to its OS thread, for fn to
// switch the thread into another namespace, then switches it back and
// unlocks it; if switching back fails the thread stays locked and the
// runtime retires it, so a namespace never leaks to other goroutines.
func RunLocked(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
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

// Do runs fn on a thread inside the namespace. Sockets fn creates stay in
// the namespace for their whole life, wherever they are used later.
func (ns *NS) Do(fn func() error) error {
	return RunLocked(func() error {
		if err := unix.Setns(ns.Fd(), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return fn()
	})
}

// Dial connects from inside the namespace. addr must be an IP literal: no
// name resolution happens here.
func (ns *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the namespace.
func (ns *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// ListenPacket listens for datagrams inside the namespace.
func (ns *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := ns.Do(func() error {
		var err error
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

// Netlink returns a netlink handle that works inside the namespace,
// closed when the test ends.
func (ns *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		t.Fatalf("netlink handle in netns: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// WriteSysctl writes a /proc/sys file as seen from inside the namespace.
func (ns *NS) WriteSysctl(path, value string) error {
	return ns.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) })
}
