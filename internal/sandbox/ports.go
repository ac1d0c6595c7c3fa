package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/tenancy"
)

// PortDialer is the optional ability of a Network to connect to a port
// inside a sandbox's namespace. *network.Manager implements it.
type PortDialer interface {
	// DialLoopback connects to 127.0.0.1:port inside sandbox id's
	// network namespace.
	DialLoopback(ctx context.Context, id string, port uint16) (net.Conn, error)
}

var _ PortDialer = (*network.Manager)(nil)

// DialPort opens a TCP connection from the daemon to 127.0.0.1:port of a
// running sandbox, for port forwarding; servers bound to loopback or to
// all addresses are reached, in every network mode. Runtimes on the
// kernel's network stack (Isolation "container": runc) are dialed from a
// thread in the sandbox's network namespace, which costs no agent round
// trip. Others (gVisor's netstack has its own loopback; VMs) go through the
// agent, which connects inside and carries the bytes (agentclient.Connect).
// Nothing listening is errdefs.ErrUnavailable. ctx bounds the dial only.
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "port %d out of range 1-65535", port)
	}
	m.mu.RLock()
	e, ok := m.sandboxes[id]
	ok = ok && tenancy.Sees(ctx, e.sb.Tenant)
	var sb Sandbox
	var client *agentclient.Client
	if ok {
		sb, client = e.sb, e.agent
	}
	m.mu.RUnlock()
	switch {
	case !ok:
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	case sb.State != StateRunning || client == nil:
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, sb.State)
	}
	if d := m.drivers[sb.Runtime]; d == nil || d.Capabilities().Isolation != "container" {
		c, err := client.Connect(ctx, port)
		if err != nil {
			return nil, fmt.Errorf("port %d of sandbox %s: %w", port, id, err)
		}
		return c, nil
	}
	pd, ok := m.cfg.Network.(PortDialer)
	if !ok || !m.managedNetwork(sb) {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has no network namespace managed by this daemon: its ports are unreachable", id)
	}
	c, err := pd.DialLoopback(ctx, id, uint16(port))
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "port %d of sandbox %s: nothing listens on port %d", port, id, port)
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d of sandbox %s: %w", port, id, err)
	}
	return c, nil
}
