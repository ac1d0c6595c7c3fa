package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
)

// PortDialer is the optional ability of a Network to connect to sandbox
// ports. *network.Manager implements it.
type PortDialer interface {
	// DialLoopback connects to 127.0.0.1:port inside the sandbox's
	// namespace, DialSandbox to the sandbox's address through its veth.
	DialLoopback(ctx context.Context, id string, port uint16) (net.Conn, error)
	DialSandbox(ctx context.Context, id string, port uint16) (net.Conn, error)
}

var _ PortDialer = (*network.Manager)(nil)

// DialPort opens a TCP connection from the daemon to port of a running
// sandbox, for port forwarding. Runtimes that use the kernel's network
// stack (Isolation "container": runc) are dialed on 127.0.0.1 inside the
// sandbox's namespace, so servers bound to loopback work and mode none
// works too. Others (gVisor's netstack owns its own loopback) are dialed
// on the sandbox's address through its veth, which reaches servers bound
// to all addresses and needs a managed network (allowlist or open); mode
// none fails with errdefs.ErrFailedPrecondition. Nothing listening is
// errdefs.ErrUnavailable.
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "port %d out of range 1-65535", port)
	}
	m.mu.RLock()
	e, ok := m.sandboxes[id]
	var sb Sandbox
	if ok {
		sb = e.sb
	}
	m.mu.RUnlock()
	switch {
	case !ok:
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	case sb.State != StateRunning:
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, sb.State)
	case !m.managedNetwork(sb):
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has no network managed by this daemon: its ports are unreachable", id)
	}
	pd, ok := m.cfg.Network.(PortDialer)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "this daemon's network cannot reach sandbox ports")
	}
	var c net.Conn
	var err error
	if d := m.drivers[sb.Runtime]; d != nil && d.Capabilities().Isolation == "container" {
		c, err = pd.DialLoopback(ctx, id, uint16(port))
	} else if sb.Network.Mode == egress.ModeNone {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs on %s with network mode none: its own network stack is reachable only through a managed network (create it with mode allowlist or open)", id, sb.Runtime)
	} else {
		c, err = pd.DialSandbox(ctx, id, uint16(port))
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "nothing listens on port %d of sandbox %s", port, id)
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d of sandbox %s: %w", port, id, err)
	}
	return c, nil
}
