package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network/nettest"
)

func allowlist(domains ...string) egress.Policy {
	p := egress.Policy{Mode: egress.ModeAllowlist}
	for _, d := range domains {
		p.Domains = append(p.Domains, egress.DomainRule{Name: d})
	}
	return p
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := Config{Subnet: netip.MustParsePrefix("10.200.0.0/16"), StateDir: "/nonexistent", Ports: egress.DefaultServerPorts()}
	tests := []struct {
		name   string
		change func(*Config)
	}{
		{"public subnet", func(c *Config) { c.Subnet = netip.MustParsePrefix("198.51.100.0/24") }},
		{"ipv6 subnet", func(c *Config) { c.Subnet = netip.MustParsePrefix("fd00::/64") }},
		{"subnet too small", func(c *Config) { c.Subnet = netip.MustParsePrefix("10.0.0.0/31") }},
		{"loopback subnet", func(c *Config) { c.Subnet = netip.MustParsePrefix("127.0.0.0/16") }},
		{"prefix too long for the slots", func(c *Config) { c.NamePrefix = "abcdefghijk" }},
		{"prefix with dash", func(c *Config) { c.NamePrefix = "c-r" }},
		{"bad table", func(c *Config) { c.Table = "a b" }},
		{"no state dir", func(c *Config) { c.StateDir = "" }},
		{"no ports", func(c *Config) { c.Ports = egress.Ports{} }},
		{"same ports", func(c *Config) { c.Ports = egress.Ports{DNS: 53, Transparent: 8080, HTTPProxy: 8080} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.change(&cfg)
			if _, err := New(cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("New: err = %v, want invalid argument", err)
			}
		})
	}
}

func linkNames(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	slices.Sort(out)
	return out
}

// TestSetupTeardown checks each mode's network, made in Setup and taken
// from a spare (spare.go).
func TestSetupTeardown(t *testing.T) {
	t.Run("made", func(t *testing.T) { testSetupTeardown(t, false) })
	t.Run("spare", func(t *testing.T) { testSetupTeardown(t, true) })
}

func testSetupTeardown(t *testing.T, spares bool) {
	cfg := testConfig(t)
	fe := newFakeEgress()
	cfg.Egress = fe
	if spares {
		cfg.Spares = 1
		cfg.SpareDelay = time.Hour // the test makes them itself
	}
	m := newTestManager(t, cfg)
	ctx := t.Context()

	for _, mode := range []egress.Mode{egress.ModeNone, egress.ModeAllowlist, egress.ModeOpen} {
		t.Run(string(mode), func(t *testing.T) {
			id := "sb-" + string(mode)
			var sp spare
			if spares {
				sp = makeSpares(t, m, mode != egress.ModeNone)
			}
			sb, err := m.Setup(ctx, id, egress.Policy{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			if spares {
				checkSpareTaken(t, m, sp, sb)
			}
			if sb.NetNSPath != cfg.StateDir+"/netns/"+id {
				t.Errorf("NetNSPath = %s", sb.NetNSPath)
			}
			ns := nettest.OpenNS(t, sb.NetNSPath)
			h := ns.Netlink(t)
			names := linkNames(t, h)
			var v6 string
			_ = ns.Do(func() error {
				b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
				v6 = strings.TrimSpace(string(b))
				return err
			})
			if v6 != "1" {
				t.Errorf("IPv6 in the netns: disable_ipv6 = %q, want 1", v6)
			}
			if mode == egress.ModeNone {
				if !slices.Equal(names, []string{"lo"}) {
					t.Errorf("mode none: links %v, want only lo", names)
				}
				if sb.HostIface != "" || sb.HostAddr.IsValid() || len(sb.ProxyEnv()) != 0 {
					t.Errorf("mode none has a host side: %+v", sb)
				}
				if got := fe.ids(); slices.Contains(got, id) {
					t.Errorf("mode none attached egress")
				}
			} else {
				if !slices.Equal(names, []string{"eth0", "lo"}) {
					t.Errorf("links %v, want eth0 and lo", names)
				}
				eth, _ := h.LinkByName("eth0")
				addrs, _ := h.AddrList(eth, netlink.FAMILY_ALL)
				if len(addrs) != 1 || addrs[0].IPNet.String() != sb.Addr.String() {
					t.Errorf("eth0 addresses %v, want only %s", addrs, sb.Addr)
				}
				routes, _ := h.RouteList(eth, netlink.FAMILY_V4)
				if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
					return (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw.String() == sb.HostAddr.String()
				}) {
					t.Errorf("no default route via %s: %v", sb.HostAddr, routes)
				}
				host, err := netlink.LinkByName(sb.HostIface)
				if err != nil {
					t.Fatal(err)
				}
				if host.Attrs().Alias != id || host.Attrs().OperState != netlink.OperUp {
					t.Errorf("host link: alias %q state %v", host.Attrs().Alias, host.Attrs().OperState)
				}
				if got := fe.ids(); !slices.Contains(got, id) {
					t.Errorf("egress not attached: %v", got)
				}
				if !strings.Contains(nftList(t, cfg), "sb-"+id+"-fwd") {
					t.Errorf("no chains:\n%s", nftList(t, cfg))
				}
				if _, err := m.Setup(ctx, id, egress.Policy{Mode: mode}); !errors.Is(err, errdefs.ErrAlreadyExists) {
					t.Errorf("second Setup: %v, want already exists", err)
				}
			}
			if err := m.Teardown(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := m.Teardown(ctx, id); err != nil {
				t.Errorf("second Teardown: %v", err)
			}
			if got := fe.ids(); slices.Contains(got, id) {
				t.Errorf("egress still attached")
			}
			m.waitReaped()
			m.removeSpares(false)
			assertClean(t, cfg, false)
		})
	}
}

// makeSpares has m make its spares of every kind at once and returns the
// one Setup with link will take.
func makeSpares(t testing.TB, m *Manager, link bool) spare {
	t.Helper()
	m.mu.Lock()
	m.spareWanted = [2]bool{true, true}
	m.mu.Unlock()
	m.spareRefill.Run()
	m.mu.Lock()
	defer m.mu.Unlock()
	ready := m.spares[spareKind(link)]
	if len(ready) != m.cfg.Spares {
		t.Fatalf("%d spares ready, want %d", len(ready), m.cfg.Spares)
	}
	return ready[len(ready)-1]
}

// checkSpareTaken checks that sb was made from sp: sp's namespace mount is
// gone from its own path, sb's interface is sp's, and no spare of its kind
// is left (the refill waits for SpareDelay).
func checkSpareTaken(t *testing.T, m *Manager, sp spare, sb *Sandbox) {
	t.Helper()
	if _, err := os.Stat(m.netnsPath(sp.name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spare namespace %s still there: %v", sp.name, err)
	}
	if sp.slot >= 0 && sb.HostIface != m.ifaceName(sp.slot) {
		t.Errorf("interface %s, want the spare's %s", sb.HostIface, m.ifaceName(sp.slot))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.spares[spareKind(sp.slot >= 0)]); n != m.cfg.Spares-1 {
		t.Errorf("%d spares left, want %d", n, m.cfg.Spares-1)
	}
	if sp.slot >= 0 && m.used[sp.slot] != sb.ID {
		t.Errorf("slot %d belongs to %q, want %s", sp.slot, m.used[sp.slot], sb.ID)
	}
}

func TestUpdate(t *testing.T) {
	cfg := testConfig(t)
	fe := newFakeEgress()
	cfg.Egress = fe
	m := newTestManager(t, cfg)
	ctx := t.Context()
	if _, err := m.Setup(ctx, "a", allowlist("allowed.test")); err != nil {
		t.Fatal(err)
	}
	sb, _ := m.Get("a")
	fwd := "/proc/sys/net/ipv4/conf/" + sb.HostIface + "/forwarding"
	readFwd := func() string { b, _ := os.ReadFile(fwd); return strings.TrimSpace(string(b)) }
	if readFwd() != "0" {
		t.Errorf("forwarding on for an allowlist without CIDRs")
	}
	p := allowlist("allowed.test", "other.test")
	p.CIDRs = []egress.CIDRRule{{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Ports: []uint16{8080}}}
	if err := m.Update(ctx, "a", p); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nftList(t, cfg), "dport 8080 accept") || readFwd() != "1" {
		t.Errorf("update not applied: forwarding %s\n%s", readFwd(), nftList(t, cfg))
	}
	if got := fe.attached["a"]; len(got.Domains) != 2 {
		t.Errorf("egress policy not updated: %+v", got)
	}
	if err := m.Update(ctx, "a", egress.Policy{Mode: egress.ModeNone}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Update to none: %v, want failed precondition", err)
	}
	if err := m.Update(ctx, "nope", p); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update unknown: %v, want not found", err)
	}
	if err := m.Update(ctx, "a", egress.Policy{Mode: "x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Update invalid: %v, want invalid argument", err)
	}
}

// TestSetupRollback makes each step of Setup fail in turn and checks that
// nothing is left behind and the address is free again.
func TestSetupRollback(t *testing.T) {
	cfg := testConfig(t)
	fe := newFakeEgress()
	cfg.Egress = fe
	m := newTestManager(t, cfg)
	ctx := t.Context()
	for _, step := range []string{"netns", "veth", "addr", "nft", "egress", "nft from a spare"} {
		t.Run(step, func(t *testing.T) {
			step, spared := strings.CutSuffix(step, " from a spare")
			if spared {
				m.cfg.Spares = 1
				defer func() { m.cfg.Spares = 0 }()
				makeSpares(t, m, true)
			}
			injected := errors.New("injected failure")
			m.fail = func(s string) error {
				if s == step {
					return injected
				}
				return nil
			}
			defer func() { m.fail = nil }()
			_, err := m.Setup(ctx, "rb", allowlist("allowed.test"))
			if !errors.Is(err, injected) {
				t.Fatalf("Setup: %v, want the injected failure", err)
			}
			m.removeSpares(false)
			assertClean(t, cfg, false)
			if ids := fe.ids(); len(ids) != 0 {
				t.Errorf("egress still attached: %v", ids)
			}
			if len(m.used) != 0 || len(m.sandboxes) != 0 {
				t.Errorf("slots or entries not released: %v %v", m.used, m.sandboxes)
			}
		})
	}
	t.Run("egress attach fails", func(t *testing.T) {
		fe.failWith = errors.New("port taken")
		defer func() { fe.failWith = nil }()
		if _, err := m.Setup(ctx, "rb", allowlist()); err == nil {
			t.Fatal("Setup succeeded")
		}
		assertClean(t, cfg, false)
	})
	t.Run("then it works", func(t *testing.T) {
		if _, err := m.Setup(ctx, "rb", allowlist()); err != nil {
			t.Fatal(err)
		}
		if err := m.Teardown(ctx, "rb"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReconcile plays a daemon restart: one Manager sets networks up and
// goes away; a new one finds them, keeps one and removes the rest.
func TestReconcile(t *testing.T) {
	cfg := testConfig(t)
	ctx := t.Context()
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for id, mode := range map[string]egress.Mode{"gone-none": egress.ModeNone, "gone": egress.ModeAllowlist, "kept": egress.ModeAllowlist, "kept-none": egress.ModeNone} {
		if _, err := first.Setup(ctx, id, egress.Policy{Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	// An interface a crash left without its alias.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.NamePrefix + "999"}, PeerName: cfg.NamePrefix + "peer"}); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}

	fe := newFakeEgress()
	cfg.Egress = fe
	m := newTestManager(t, cfg)
	ids, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gone", "gone-none", "kept", "kept-none"}; !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want %v", ids, want)
	}
	keep := map[string]egress.Policy{"kept": allowlist("allowed.test"), "kept-none": {Mode: egress.ModeNone}, "missing": allowlist()}
	err = m.Reconcile(ctx, keep)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Reconcile: %v, want not found for the missing sandbox only", err)
	}
	if ids, _ := m.List(ctx); !slices.Equal(ids, []string{"kept", "kept-none"}) {
		t.Errorf("after Reconcile: %v", ids)
	}
	if _, err := netlink.LinkByName(cfg.NamePrefix + "999"); err == nil {
		t.Error("orphan interface not removed")
	}
	if got := fe.ids(); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("egress attached for %v", got)
	}
	if err := m.Update(ctx, "kept", allowlist("other.test")); err != nil {
		t.Errorf("Update after adoption: %v", err)
	}
	// The adopted sandbox's slot is taken: a new one gets another.
	sb, err := m.Setup(ctx, "new", allowlist())
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := m.Get("kept")
	if sb.HostAddr == kept.HostAddr {
		t.Errorf("new sandbox got the adopted one's address %s", sb.HostAddr)
	}
	// Teardown also works for ids only the kernel knows.
	other := newTestManager(t, cfg)
	if err := other.Teardown(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(sb.HostIface); err == nil {
		t.Error("Teardown by a Manager that never saw the sandbox left its interface")
	}
}

// TestHundredSandboxes sets up and tears down 100 networks, four at a
// time, and checks that no interface, namespace, mount, chain, table,
// address or route is left.
func TestHundredSandboxes(t *testing.T) {
	cfg := testConfig(t)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var ids []string
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("h%03d", i))
	}
	parallel := func(fn func(i int, id string) error) {
		var g errgroup
		work := make(chan int)
		for range 4 {
			g.Go(func() error {
				var first error
				for i := range work { // keep draining after an error
					if err := fn(i, ids[i]); err != nil && first == nil {
						first = err
					}
				}
				return first
			})
		}
		for i := range ids {
			work <- i
		}
		close(work)
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	parallel(func(i int, id string) error {
		mode := egress.ModeAllowlist
		if i%10 == 0 {
			mode = egress.ModeNone
		}
		_, err := m.Setup(ctx, id, egress.Policy{Mode: mode})
		return err
	})
	if left := leftovers(t, cfg, false); len(left) < 100+90*2 {
		t.Errorf("only %d objects after setup; the leak check would see nothing", len(left))
	}
	addrs := map[netip.Addr]string{}
	for _, id := range ids {
		sb, _ := m.Get(id)
		if other, dup := addrs[sb.HostAddr]; dup && sb.HostAddr.IsValid() {
			t.Errorf("%s and %s share %s", id, other, sb.HostAddr)
		}
		addrs[sb.HostAddr] = id
	}
	parallel(func(_ int, id string) error { return m.Teardown(ctx, id) })
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertClean(t, cfg, true)
}

// errgroup runs goroutines and keeps the first error.
type errgroup struct {
	wg   sync.WaitGroup
	once sync.Once
	err  error
}

func (g *errgroup) Go(fn func() error) {
	g.wg.Go(func() {
		if err := fn(); err != nil {
			g.once.Do(func() { g.err = err })
		}
	})
}

func (g *errgroup) Wait() error {
	g.wg.Wait()
	return g.err
}

// TestTeardownPartialState removes pieces of a sandbox's network behind
// the Manager's back; Teardown must still remove the rest and succeed.
func TestTeardownPartialState(t *testing.T) {
	cfg := testConfig(t)
	m := newTestManager(t, cfg)
	ctx := t.Context()
	for name, breakIt := range map[string]func(sb *Sandbox){
		"veth gone": func(sb *Sandbox) {
			if err := m.deleteLink(sb.HostIface); err != nil {
				t.Fatal(err)
			}
		},
		"one chain and map entry gone": func(sb *Sandbox) {
			c, _ := nftables.New()
			if err := c.SetDeleteElements(m.nft.vmapSet(mapIn), []nftables.SetElement{{Key: ifnameKey(sb.HostIface)}}); err != nil {
				t.Fatal(err)
			}
			ch := &nftables.Chain{Name: sandboxChain(sb.ID, kindIn), Table: m.nft.table}
			c.FlushChain(ch)
			c.DelChain(ch)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		},
		"netns unmounted": func(sb *Sandbox) {
			if err := removeNetNS(sb.NetNSPath); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			sb, err := m.Setup(ctx, "partial", allowlist())
			if err != nil {
				t.Fatal(err)
			}
			breakIt(sb)
			if err := m.Teardown(ctx, "partial"); err != nil {
				t.Fatal(err)
			}
			m.waitReaped()
			assertClean(t, cfg, false)
		})
	}
}

// TestTeardownInBackground: Teardown returns before the chains and veth
// are gone; a Setup of the same id right away waits for them and keeps
// its own chains; a full batch of removals is one commit (no ENOBUFS
// fallback).
func TestTeardownInBackground(t *testing.T) {
	cfg := testConfig(t)
	m := newTestManager(t, cfg)
	ctx := t.Context()
	if _, err := m.Setup(ctx, "again", allowlist()); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	sb, err := m.Setup(ctx, "again", allowlist())
	if err != nil {
		t.Fatalf("Setup right after Teardown: %v", err)
	}
	m.waitReaped()
	if rules := nftList(t, cfg); !strings.Contains(rules, "chain "+sandboxChain("again", kindIn)) || !strings.Contains(rules, sb.HostIface) {
		t.Fatalf("the second setup's chains are gone:\n%s", rules)
	}
	if err := m.Teardown(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	m.waitReaped()
	assertClean(t, cfg, false)

	var items []reapItem
	for i := range removeBatch {
		sb, err := m.Setup(ctx, fmt.Sprintf("b%d", i), allowlist())
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, reapItem{id: sb.ID, iface: sb.HostIface})
	}
	if err := m.nft.removeChunk(items); err != nil {
		t.Fatalf("removing %d sandboxes in one commit: %v", len(items), err)
	}
}
