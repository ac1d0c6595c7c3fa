package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// Inbound connections: the daemon reaches a port of a sandbox for its
// port forwarding. Nothing outside the host can open a connection into a
// sandbox (the rules drop it); the daemon can, because its connections
// start on the host: replies come back as established traffic.

// DialLoopback connects to 127.0.0.1:port inside sandbox id's network
// namespace, from a thread that joins the namespace for the socket call
// only. It reaches servers bound to loopback or to any address, in every
// mode including none, for runtimes that use the namespace's kernel
// network stack (runc). gVisor's netstack owns its own loopback: use
// DialSandbox there. An unknown id fails with errdefs.ErrNotFound, a
// closed port with ECONNREFUSED.
func (m *Manager) DialLoopback(ctx context.Context, id string, port uint16) (net.Conn, error) {
	sb, ok := m.Get(id)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no network for sandbox %s", id)
	}
	ns, err := os.Open(sb.NetNSPath)
	if err != nil {
		return nil, fmt.Errorf("opening netns of sandbox %s: %w", id, err)
	}
	defer ns.Close()
	var c net.Conn
	err = runOnOwnThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("joining netns of sandbox %s: %w", id, err)
		}
		// The socket belongs to the namespace it was created in; the
		// connect then completes through the netpoller on this thread.
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		return err
	})
	return c, err
}

// DialSandbox connects from the host to port of sandbox id's address,
// through its veth. It reaches servers bound to any address (0.0.0.0) or
// to eth0's, whatever network stack the runtime uses. Mode none has no
// veth and fails with errdefs.ErrFailedPrecondition.
func (m *Manager) DialSandbox(ctx context.Context, id string, port uint16) (net.Conn, error) {
	sb, ok := m.Get(id)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no network for sandbox %s", id)
	}
	if !sb.Addr.IsValid() {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has network mode %s: no address the host can reach", id, sb.Mode)
	}
	addr := netip.AddrPortFrom(sb.Addr.Addr(), port)
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr.String())
}
