package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// DialLoopback connects to 127.0.0.1:port inside sandbox id's network
// namespace, from a thread that joins the namespace for the socket call
// only. It reaches servers bound to loopback or to any address, in every
// mode including none, for runtimes that use the namespace's kernel
// network stack (runc); gVisor's netstack owns its own loopback, which
// only its agent reaches. An unknown id fails with errdefs.ErrNotFound, a
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
