package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
)

// linksByID maps sandbox ids to host interfaces with the Manager's prefix,
// from the ids stored in the interfaces' aliases.
func (m *Manager) linksByID() (map[string]string, error) {
	links, err := listLinks(m.nl)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := map[string]string{}
	for _, l := range links {
		a := l.Attrs()
		if m.ownsIface(a.Name) && a.Alias != "" {
			out[a.Alias] = a.Name
		}
	}
	return out, nil
}

// ownsIface reports whether name is prefix followed by a slot number.
func (m *Manager) ownsIface(name string) bool {
	rest, ok := strings.CutPrefix(name, m.cfg.NamePrefix)
	if !ok || rest == "" {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n >= 0 && strconv.Itoa(n) == rest
}

// List returns the ids of every sandbox network on the host, whether this
// Manager created it or an earlier daemon did: namespace mounts under the
// state directory, host interfaces with the name prefix, and sandbox
// chains in the table. The result is sorted.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(m.cfg.StateDir, "netns"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing netns directory: %w", err)
	}
	for _, de := range entries {
		seen[de.Name()] = true
	}
	links, err := m.linksByID()
	if err != nil {
		return nil, err
	}
	for id := range links {
		seen[id] = true
	}
	ids, err := m.nft.sandboxIDs()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		seen[id] = true
	}
	out := make([]string, 0, len(seen))
	for id := range seen {
		if driver.ValidID(id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Reconcile brings the host in line with the sandboxes a restarted daemon
// keeps: every network found (see List) whose id is in keep is adopted,
// its rules rewritten from keep's policy and its egress attached; every
// other one is torn down, as are interfaces with the prefix that carry no
// id. A kept id with nothing usable on the host is torn down and reported
// with errdefs.ErrNotFound; the rest still proceeds.
func (m *Manager) Reconcile(ctx context.Context, keep map[string]egress.Policy) error {
	m.waitReaped()
	ids, err := m.List(ctx)
	if err != nil {
		return fmt.Errorf("reconciling networks: %w", err)
	}
	var errs []error
	links, err := listLinks(m.nl)
	if err != nil {
		return fmt.Errorf("reconciling networks: listing links: %w", err)
	}
	for _, l := range links {
		if a := l.Attrs(); m.ownsIface(a.Name) && !driver.ValidID(a.Alias) && !m.spareIface(a.Name) {
			errs = append(errs, m.deleteLink(a.Name))
		}
	}
	byID, err := m.linksByID()
	if err != nil {
		return fmt.Errorf("reconciling networks: %w", err)
	}
	for _, id := range ids {
		if m.get(id) != nil {
			continue // already managed by this Manager
		}
		p, ok := keep[id]
		if !ok {
			errs = append(errs, m.Teardown(ctx, id))
			continue
		}
		if err := m.adopt(ctx, id, byID[id], p); err != nil {
			errs = append(errs, err, m.Teardown(ctx, id))
		}
	}
	for id := range keep {
		if !slices.Contains(ids, id) && m.get(id) == nil {
			errs = append(errs, errdefs.Errorf(errdefs.ErrNotFound, "network of sandbox %s not found on the host", id))
		}
	}
	return errors.Join(errs...)
}

// adopt takes over a network an earlier daemon set up; iface is its host
// interface, if one was found.
func (m *Manager) adopt(ctx context.Context, id, iface string, p egress.Policy) error {
	p, err := p.Normalize()
	if err != nil {
		return err
	}
	path := m.netnsPath(id)
	if _, err := os.Stat(path); err != nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "adopting network of sandbox %s: no namespace at %s", id, path)
	}
	e := &entry{slot: -1, policy: egress.Policy{Mode: egress.ModeNone}}
	e.sb = Sandbox{ID: id, Mode: egress.ModeNone, NetNSPath: path, Ports: m.ports}
	if p.Mode != egress.ModeNone {
		name := iface
		slot, err := strconv.Atoi(strings.TrimPrefix(name, m.cfg.NamePrefix))
		if name == "" || err != nil || slot >= m.slots {
			return errdefs.Errorf(errdefs.ErrNotFound, "adopting network of sandbox %s: no usable interface", id)
		}
		host, addr := m.slotAddrs(slot)
		e.slot = slot
		e.sb.HostIface, e.sb.HostAddr, e.sb.Addr = name, host, netip.PrefixFrom(addr, 30)
		e.policy.Mode = p.Mode // apply below writes the rest
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	m.mu.Lock()
	if _, ok := m.sandboxes[id]; ok {
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "network of sandbox %s already exists", id)
	}
	if e.slot >= 0 {
		if other, taken := m.used[e.slot]; taken {
			m.mu.Unlock()
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "adopting network of sandbox %s: its address belongs to %s", id, other)
		}
		m.used[e.slot] = id
	}
	m.sandboxes[id] = e
	m.mu.Unlock()
	if err := m.apply(ctx, e, p); err != nil {
		m.release(id, e)
		return fmt.Errorf("adopting network of sandbox %s: %w", id, err)
	}
	return nil
}
