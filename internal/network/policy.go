package network

import (
	"context"
	"fmt"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
)

// Update replaces a running sandbox's policy: its nftables chains in one
// atomic batch, then the policy its resolver and proxies read (per query
// and per connection). Both take effect at once; connections the proxy
// already spliced keep running. Switching to or from mode none needs a
// new sandbox (runtimes such as gVisor read interfaces only at start) and
// fails with errdefs.ErrFailedPrecondition; to cut a sandbox off, update
// it to an allowlist with no rules. Unknown ids fail with
// errdefs.ErrNotFound.
func (m *Manager) Update(ctx context.Context, id string, p egress.Policy) error {
	p, err := p.Normalize()
	if err != nil {
		return err
	}
	e := m.get(id)
	if e == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "network of sandbox %s not found", id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		return errdefs.Errorf(errdefs.ErrNotFound, "network of sandbox %s not found", id)
	}
	if (e.policy.Mode == egress.ModeNone) != (p.Mode == egress.ModeNone) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s: changing network mode from %s to %s needs a new sandbox", id, e.policy.Mode, p.Mode)
	}
	if err := m.apply(ctx, e, p); err != nil {
		return fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	return nil
}

// apply writes p to a sandbox with a link: rules, forwarding, egress.
func (m *Manager) apply(ctx context.Context, e *entry, p egress.Policy) error {
	if p.Mode == egress.ModeNone {
		e.policy = p
		return nil
	}
	if err := m.nft.applySandbox(e.sb.ID, e.sb.HostIface, sandboxRules(e.sb.HostAddr, e.sb.Addr.Addr(), m.ports, p)); err != nil {
		return err
	}
	if err := setForwarding(e.sb.HostIface, needsForwarding(p)); err != nil {
		return err
	}
	if m.cfg.Egress != nil {
		if e.egress {
			if err := m.cfg.Egress.SetPolicy(e.sb.ID, p); err != nil {
				return err
			}
		} else {
			if _, err := m.cfg.Egress.Attach(ctx, e.sb.ID, e.sb.HostAddr, p); err != nil {
				return err
			}
			e.egress = true
		}
	}
	e.policy = p
	e.sb.Mode = p.Mode
	return nil
}
