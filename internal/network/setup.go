package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

// Setup creates sandbox id's network under policy p: a namespace bound at
// <StateDir>/netns/<id> with loopback up; unless the mode is none, a veth
// pair (host end in the root namespace, eth0 inside) with a /30 from the
// subnet and a default route via the host end, the sandbox's nftables
// chains, and its DNS resolver and proxies. On failure everything already
// created is removed again. Errors: an invalid id or policy wraps
// errdefs.ErrInvalidArgument, an id in use errdefs.ErrAlreadyExists, a
// full subnet errdefs.ErrResourceExhausted.
func (m *Manager) Setup(ctx context.Context, id string, p egress.Policy) (_ *Sandbox, err error) {
	if !driver.ValidID(id) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sandbox id %q not usable for a network", id)
	}
	p, err = p.Normalize()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	e := &entry{slot: -1, policy: p}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sb = Sandbox{ID: id, Mode: p.Mode, NetNSPath: m.netnsPath(id), Ports: m.ports}
	link := p.Mode != egress.ModeNone
	sp, spared := m.takeSpare(link)
	if err := m.reserve(id, e, link, sp); err != nil {
		if spared {
			m.returnSpare(sp)
		}
		return nil, err
	}

	var u undo.Stack
	defer func() {
		if err == nil {
			u.Keep()
			return
		}
		if uerr := u.Undo(ctx); uerr != nil {
			// Setup's error is what the caller sees; the leftover is
			// found by Reconcile or a later Teardown.
			m.log.Warn("undoing network setup", "sandbox_id", id, "error", uerr)
		}
		err = fmt.Errorf("setting up network of sandbox %s: %w", id, err)
	}()
	u.Add(func(context.Context) error {
		e.gone = true
		m.release(id, e)
		return nil
	})
	if err := m.placeNetNS(e, sp, spared, &u); err != nil {
		return nil, err
	}
	if link {
		if err := m.confineLink(ctx, e, &u); err != nil {
			return nil, err
		}
	}
	m.log.Debug("network set up", "sandbox_id", id, "mode", string(p.Mode), "iface", e.sb.HostIface, "spare", spared,
		"duration_ms", float64(time.Since(start).Microseconds())/1000)
	sb := e.sb
	return &sb, nil
}

// placeNetNS puts e's namespace, and its veth when e has a slot, in place:
// the spare sp's when spared, or else new ones. It registers their removal
// on u.
func (m *Manager) placeNetNS(e *entry, sp spare, spared bool, u *undo.Stack) error {
	var err error
	if spared {
		err = m.moveNetNS(sp, e.sb.NetNSPath)
		if err != nil {
			m.destroySpare(sp)
		}
	} else {
		err = m.makeNetNS(e.sb.NetNSPath, e.slot)
	}
	if err != nil {
		return err
	}
	u.Add(func(context.Context) error { return removeNetNS(e.sb.NetNSPath) })
	if e.slot >= 0 {
		u.Add(func(context.Context) error { return m.deleteLink(e.sb.HostIface) })
	}
	return m.step("netns")
}

// confineLink gives e's veth to the sandbox, writes its nftables chains
// from e's policy and attaches its egress, registering each removal on u.
func (m *Manager) confineLink(ctx context.Context, e *entry, u *undo.Stack) error {
	id := e.sb.ID
	if err := m.nameLink(e); err != nil {
		return err
	}
	if err := m.nft.applySandbox(id, e.sb.HostIface, sandboxRules(e.sb.HostAddr, e.sb.Addr.Addr(), m.ports, e.policy)); err != nil {
		return err
	}
	u.Add(func(context.Context) error { return m.nft.removeSandbox(id, e.sb.HostIface) })
	if err := m.step("nft"); err != nil {
		return err
	}
	if m.cfg.Egress == nil {
		return nil
	}
	if _, err := m.cfg.Egress.Attach(ctx, id, e.sb.HostAddr, e.policy); err != nil {
		return err
	}
	e.egress = true
	u.Add(func(context.Context) error { return m.cfg.Egress.Detach(id) })
	return m.step("egress")
}

// makeNetNS creates a namespace at path and, if slot is not -1, the veth
// pair of that slot: the host end with its address, no IPv6 and no
// forwarding, eth0 inside with the sandbox's address and a default route.
// On failure it removes what it made.
func (m *Manager) makeNetNS(path string, slot int) (err error) {
	nsh, err := createNetNS(path)
	if err != nil {
		return err
	}
	defer nsh.Close()
	if slot < 0 {
		return nil
	}
	name := m.ifaceName(slot)
	var u undo.Stack
	defer u.OnError(context.Background(), &err)
	u.Add(func(context.Context) error { return removeNetNS(path) })
	// Registered before LinkAdd, whose failure may be a stale link of this
	// slot's name: removing it lets the next Setup of the slot succeed, and
	// deleteLink of a link that is not there does nothing.
	u.Add(func(context.Context) error { return m.deleteLink(name) })
	host, addr := m.slotAddrs(slot)
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening netns: %w", err)
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns.Fd())),
	}
	if err := m.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s: %w", name, err)
	}
	if err := m.step("veth"); err != nil {
		return err
	}
	// No IPv6 on the host end: no link-local address, no neighbor
	// discovery, nothing for the sandbox to reach over IPv6.
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", "1"); err != nil {
		return err
	}
	if err := setForwarding(name, false); err != nil {
		return err
	}
	if err := m.nl.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(host, 30))}); err != nil {
		return fmt.Errorf("adding %s to %s: %w", host, name, err)
	}
	if err := m.nl.LinkSetUp(veth); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	eth, err := nsh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("finding eth0 in netns: %w", err)
	}
	if err := nsh.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, 30))}); err != nil {
		return fmt.Errorf("adding %s to eth0: %w", addr, err)
	}
	if err := nsh.LinkSetUp(eth); err != nil {
		return fmt.Errorf("setting eth0 up: %w", err)
	}
	if err := nsh.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: host.AsSlice()}); err != nil {
		return fmt.Errorf("adding default route: %w", err)
	}
	return m.step("addr")
}

// nameLink gives e's veth (made by makeNetNS for e.slot) to the sandbox:
// the alias carries the sandbox id, so that List finds the interface after
// a restart (the kernel ignores an alias given at creation; an interface
// left without one by a crash is an orphan that Reconcile removes), and
// forwarding follows the policy.
func (m *Manager) nameLink(e *entry) error {
	name := e.sb.HostIface
	l, err := m.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding %s: %w", name, err)
	}
	if err := m.nl.LinkSetAlias(l, e.sb.ID); err != nil {
		return fmt.Errorf("naming %s: %w", name, err)
	}
	return setForwarding(name, needsForwarding(e.policy))
}

// setForwarding turns IPv4 forwarding on or off for packets arriving on
// one interface (net.ipv4.conf.<if>.forwarding), leaving the host's
// global setting alone. nftables decides what is forwarded; this keeps a
// sandbox without CIDR rules or open mode from being routed anywhere even
// if the rules were missing.
func setForwarding(iface string, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	return writeSysctl("/proc/sys/net/ipv4/conf/"+iface+"/forwarding", v)
}

func (m *Manager) deleteLink(name string) error {
	l, err := m.nl.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding %s: %w", name, err)
	}
	if err := m.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// Teardown removes everything of sandbox id: its egress, nftables chains,
// veth and namespace mount. It is idempotent and works for ids this
// Manager never saw (leftovers of an earlier daemon), finding them by
// name. If a step fails the others still run, and a later Teardown
// retries.
//
// For a sandbox of this Manager with a veth it returns once the egress is
// detached and the namespace unmounted; its
// chains and veth go in a background batch (reap.go), its address stays
// reserved until then, and Close and Reconcile wait for it.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if !driver.ValidID(id) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "sandbox id %q not usable for a network", id)
	}
	start := time.Now()
	e := m.get(id)
	iface := ""
	if e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.gone {
			return nil
		}
		iface = e.sb.HostIface
	} else {
		m.mu.Lock()
		m.waitReapedID(id)
		m.mu.Unlock()
		found, err := m.linksByID()
		if err != nil {
			return fmt.Errorf("tearing down network of sandbox %s: %w", id, err)
		}
		iface = found[id]
	}
	var errs []error
	if m.cfg.Egress != nil {
		errs = append(errs, m.cfg.Egress.Detach(id))
	}
	if e != nil && e.slot >= 0 {
		// The quick part now, the rest in a batch (reap.go).
		errs = append(errs, removeNetNS(m.netnsPath(id)))
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("tearing down network of sandbox %s: %w", id, err)
		}
		e.gone = true
		m.mu.Lock()
		if m.sandboxes[id] == e {
			delete(m.sandboxes, id)
		}
		m.queueReap(reapItem{id: id, iface: iface, slot: e.slot})
		m.mu.Unlock()
		m.log.Debug("network torn down", "sandbox_id", id, "duration_ms", float64(time.Since(start).Microseconds())/1000)
		return nil
	}
	if e == nil || e.slot >= 0 {
		errs = append(errs, m.nft.removeSandbox(id, iface))
	}
	if iface != "" {
		errs = append(errs, m.deleteLink(iface))
	}
	errs = append(errs, removeNetNS(m.netnsPath(id)))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tearing down network of sandbox %s: %w", id, err)
	}
	if e != nil {
		e.gone = true
		m.release(id, e)
	}
	m.log.Debug("network torn down", "sandbox_id", id, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	return nil
}
