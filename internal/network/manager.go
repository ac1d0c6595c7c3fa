package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/refill"
)

// Egress is the per-sandbox DNS resolver and proxy the Manager starts on a
// sandbox's host address after its interface exists, re-points on Update
// and stops on Teardown. *egress.Server implements it.
type Egress interface {
	// Ports are where the resolver and proxies listen; nftables sends
	// the sandbox's DNS and TCP 80/443 there.
	Ports() egress.Ports
	Attach(ctx context.Context, id string, addr netip.Addr, p egress.Policy) (egress.Addrs, error)
	SetPolicy(id string, p egress.Policy) error
	// Detach must be idempotent.
	Detach(id string) error
}

var _ Egress = (*egress.Server)(nil)

// Config configures a Manager.
type Config struct {
	// Subnet holds every sandbox's addresses, carved into /30 links (host
	// end .1, sandbox .2 of each). It must be IPv4 and lie inside 10/8,
	// 172.16/12, 192.168/16 or 100.64/10, so that sandboxes' addresses are
	// among the always-blocked ranges. A /16 holds 16384 sandboxes.
	Subnet netip.Prefix
	// StateDir holds the namespaces' bind mounts, at
	// <StateDir>/netns/<id>.
	StateDir string
	// NamePrefix starts every host-side interface name ("crl" makes
	// crl0, crl1, ...). Interfaces with this prefix belong to the Manager:
	// Reconcile removes unknown ones, and nftables drops traffic from any
	// of them it has no rules for. Lower-case letters and digits.
	NamePrefix string
	// Table is the nftables table (family inet) the Manager owns.
	Table string
	// Egress serves DNS and the proxies. Nil runs without them (tests of
	// the plumbing alone); Ports then says where nftables points.
	Egress Egress
	Ports  egress.Ports
	// Spares is how many networks of each kind (a namespace alone, and a
	// namespace with a veth) the Manager keeps made ahead for Setup to
	// take (spare.go); 0 makes every network in Setup. SpareDelay is how
	// long after Setup takes one the Manager starts to replace it (0:
	// DefaultSpareDelay).
	Spares     int
	SpareDelay time.Duration
	Logger     *slog.Logger
}

// Sandbox is the network of one sandbox, as a runtime needs it.
type Sandbox struct {
	ID   string
	Mode egress.Mode
	// NetNSPath is the bind-mounted namespace, for the OCI spec's
	// linux.namespaces entry {"type": "network", "path": NetNSPath}.
	NetNSPath string
	// HostIface is the host end of the veth; empty in mode none.
	HostIface string
	// HostAddr is the host end's address: the sandbox's gateway, DNS
	// server and proxy. Invalid in mode none.
	HostAddr netip.Addr
	// Addr is eth0's address inside the sandbox, with its /30.
	Addr  netip.Prefix
	Ports egress.Ports
}

// ResolvConf is the /etc/resolv.conf the sandbox should see. In mode none
// it names loopback, so lookups fail at once instead of timing out.
func (s Sandbox) ResolvConf() string {
	if !s.HostAddr.IsValid() {
		return "nameserver 127.0.0.1\n"
	}
	return "nameserver " + s.HostAddr.String() + "\noptions timeout:2 attempts:2\n"
}

// ProxyEnv is the environment for tools that use an explicit proxy. It is
// optional: TCP 80/443 reach the proxy transparently anyway; with it, any
// port a domain rule lists works too (through CONNECT). Nil in mode none.
func (s Sandbox) ProxyEnv() []string {
	if !s.HostAddr.IsValid() {
		return nil
	}
	u := "http://" + netip.AddrPortFrom(s.HostAddr, s.Ports.HTTPProxy).String()
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	}
}

// Manager gives sandboxes their networks. Methods are safe for concurrent
// use; calls for the same id are serialized.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	ports egress.Ports
	nl    *netlink.Handle // root namespace
	nft   *nft
	base  uint32 // first address of the subnet
	slots int

	mu        sync.Mutex
	sandboxes map[string]*entry
	used      map[int]string // slot -> id
	next      int            // next slot to try: addresses rotate, so a freed one is not reused at once
	// Teardowns finishing in the background (reap.go); reapCond (on mu)
	// signals each finished batch.
	reapQ         []reapItem
	reaping       map[string]bool // ids in reapQ or in the running batch
	reaperRunning bool
	reapCond      *sync.Cond
	// Networks made ahead (spare.go).
	spares      [2][]spare // by kind: [0] a namespace alone, [1] with a veth
	spareWanted [2]bool    // kinds Setup has asked for
	spareSeq    int
	spareRefill *refill.Refiller
	closed      bool
	// fail, when set by tests, makes the named setup step fail.
	fail func(step string) error
}

type entry struct {
	mu     sync.Mutex // held by Setup, Update and Teardown of this id
	sb     Sandbox
	slot   int // -1 in mode none
	policy egress.Policy
	egress bool // attached to Egress
	gone   bool
}

// validID reports whether id can name a network: 1-64 letters, digits,
// '_' or '-', starting with a letter or digit. It becomes part of a file
// name, a chain name and an interface alias.
func validID(id string) bool {
	return len(id) > 0 && len(id) <= 64 && isAlnum(id[0]) && onlyChars(id, "_-")
}

// validTable reports whether name is a usable nftables table name.
func validTable(name string) bool { return len(name) > 0 && len(name) <= 64 && onlyChars(name, "_-") }

// validPrefix reports whether p is a lower-case interface name prefix.
func validPrefix(p string) bool {
	if p == "" || p[0] < 'a' || p[0] > 'z' {
		return false
	}
	for i := 0; i < len(p); i++ {
		if !(p[i] >= 'a' && p[i] <= 'z' || p[i] >= '0' && p[i] <= '9') {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func onlyChars(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}

// New validates cfg, opens a netlink socket, removes spare namespaces an
// earlier daemon left (spare.go) and creates (or repairs) the nftables
// table with its shared chains. It does not touch existing sandboxes'
// networks: see List and Reconcile.
func New(cfg Config) (*Manager, error) {
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "crl"
	}
	if cfg.Table == "" {
		cfg.Table = "corral"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	invalid := func(format string, args ...any) error {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "network config: "+format, args...)
	}
	sub := cfg.Subnet
	if !sub.IsValid() || !sub.Addr().Is4() || sub.Bits() < 8 || sub.Bits() > 30 {
		return nil, invalid("subnet %v: want an IPv4 prefix between /8 and /30", sub)
	}
	private := false
	for _, p := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"} {
		pp := netip.MustParsePrefix(p)
		if pp.Bits() <= sub.Bits() && pp.Contains(sub.Addr()) {
			private = true
		}
	}
	if !private {
		return nil, invalid("subnet %v must lie inside 10/8, 172.16/12, 192.168/16 or 100.64/10", sub)
	}
	sub = sub.Masked()
	cfg.Subnet = sub
	slots := 1 << (32 - sub.Bits()) / 4
	if !validPrefix(cfg.NamePrefix) || len(cfg.NamePrefix)+len(strconv.Itoa(slots-1)) > unix.IFNAMSIZ-1 {
		return nil, invalid("name prefix %q: want lower-case letters and digits, short enough for %d-digit slot numbers", cfg.NamePrefix, len(strconv.Itoa(slots-1)))
	}
	if !validTable(cfg.Table) {
		return nil, invalid("table name %q", cfg.Table)
	}
	if cfg.StateDir == "" {
		return nil, invalid("no state directory")
	}
	ports := cfg.Ports
	if cfg.Egress != nil {
		ports = cfg.Egress.Ports()
	}
	if ports.DNS == 0 || ports.Transparent == 0 || ports.HTTPProxy == 0 ||
		ports.DNS == ports.Transparent || ports.DNS == ports.HTTPProxy || ports.Transparent == ports.HTTPProxy ||
		ports.DNS == refusePort || ports.Transparent == refusePort || ports.HTTPProxy == refusePort {
		return nil, invalid("ports %+v: all must be set, distinct, and not %d", ports, refusePort)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		ports:     ports,
		nl:        h,
		nft:       newNFT(cfg.Table, cfg.NamePrefix, sub),
		base:      binary.BigEndian.Uint32(sub.Addr().AsSlice()),
		slots:     slots,
		sandboxes: map[string]*entry{},
		used:      map[int]string{},
		reaping:   map[string]bool{},
	}
	m.reapCond = sync.NewCond(&m.mu)
	delay := cfg.SpareDelay
	if delay <= 0 {
		delay = DefaultSpareDelay
	}
	m.spareRefill = refill.New(delay, m.makeOneSpare)
	if err := removeStaleSpares(filepath.Join(cfg.StateDir, "netns")); err != nil {
		h.Close()
		return nil, err
	}
	if err := m.nft.ensureBase(); err != nil {
		h.Close()
		return nil, err
	}
	return m, nil
}

func (m *Manager) netnsPath(id string) string {
	return filepath.Join(m.cfg.StateDir, "netns", id)
}

func (m *Manager) slotAddrs(slot int) (host, sb netip.Addr) {
	n := m.base + uint32(slot)*4
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n+1)
	host = netip.AddrFrom4(b)
	binary.BigEndian.PutUint32(b[:], n+2)
	return host, netip.AddrFrom4(b)
}

func (m *Manager) ifaceName(slot int) string { return m.cfg.NamePrefix + strconv.Itoa(slot) }

func (m *Manager) step(name string) error {
	if m.fail != nil {
		return m.fail(name)
	}
	return nil
}

// Setup creates sandbox id's network under policy p: a namespace bound at
// <StateDir>/netns/<id> with loopback up; unless the mode is none, a veth
// pair (host end in the root namespace, eth0 inside) with a /30 from the
// subnet and a default route via the host end, the sandbox's nftables
// chains, and its DNS resolver and proxies. It takes a few milliseconds.
// On failure everything already created is removed again. Errors: an
// invalid id or policy wraps errdefs.ErrInvalidArgument, an id in use
// errdefs.ErrAlreadyExists, a full subnet errdefs.ErrResourceExhausted.
func (m *Manager) Setup(ctx context.Context, id string, p egress.Policy) (_ *Sandbox, err error) {
	if !validID(id) {
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

	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				// Setup's error is what the caller sees; the leftover is
				// found by Reconcile or a later Teardown.
				m.log.Warn("undoing network setup", "sandbox_id", id, "error", uerr)
			}
		}
		e.gone = true
		m.release(id, e)
		err = fmt.Errorf("setting up network of sandbox %s: %w", id, err)
	}()

	if spared {
		err = m.moveNetNS(sp, e.sb.NetNSPath)
		if err != nil {
			m.destroySpare(sp)
		}
	} else {
		err = m.makeNetNS(e.sb.NetNSPath, e.slot)
	}
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return removeNetNS(e.sb.NetNSPath) })
	if link {
		undo = append(undo, func() error { return m.deleteLink(e.sb.HostIface) })
	}
	if err := m.step("netns"); err != nil {
		return nil, err
	}
	if link {
		if err := m.nameLink(e); err != nil {
			return nil, err
		}
		if err := m.nft.applySandbox(id, e.sb.HostIface, sandboxRules(e.sb.HostAddr, e.sb.Addr.Addr(), m.ports, p)); err != nil {
			return nil, err
		}
		undo = append(undo, func() error { return m.nft.removeSandbox(id, e.sb.HostIface) })
		if err := m.step("nft"); err != nil {
			return nil, err
		}
		if m.cfg.Egress != nil {
			if _, err := m.cfg.Egress.Attach(ctx, id, e.sb.HostAddr, p); err != nil {
				return nil, err
			}
			e.egress = true
			undo = append(undo, func() error { return m.cfg.Egress.Detach(id) })
			if err := m.step("egress"); err != nil {
				return nil, err
			}
		}
	}
	m.log.Debug("network set up", "sandbox_id", id, "mode", string(p.Mode), "iface", e.sb.HostIface, "spare", spared,
		"duration_ms", float64(time.Since(start).Microseconds())/1000)
	sb := e.sb
	return &sb, nil
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
	defer func() {
		if err != nil {
			err = errors.Join(err, m.deleteLink(name), removeNetNS(path))
		}
	}()
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

// reserve registers id and, if needLink, gives it a slot: sp's, if sp is
// a spare with a veth, or else a free one. It fills in e.sb's interface
// and addresses.
func (m *Manager) reserve(id string, e *entry, needLink bool, sp spare) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waitReapedID(id)
	if _, ok := m.sandboxes[id]; ok {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "network of sandbox %s already exists", id)
	}
	if needLink {
		slot := sp.slot
		if slot < 0 {
			var err error
			if slot, err = m.allocSlot(); err != nil {
				return fmt.Errorf("sandbox %s: %w", id, err)
			}
		}
		m.used[slot] = id
		e.slot = slot
		host, addr := m.slotAddrs(slot)
		e.sb.HostIface, e.sb.HostAddr, e.sb.Addr = m.ifaceName(slot), host, netip.PrefixFrom(addr, 30)
	}
	m.sandboxes[id] = e
	return nil
}

// allocSlot finds a free slot; the caller holds m.mu and records its
// owner in m.used.
func (m *Manager) allocSlot() (int, error) {
	for i := range m.slots {
		s := (m.next + i) % m.slots
		if _, taken := m.used[s]; !taken {
			m.next = (s + 1) % m.slots
			return s, nil
		}
	}
	return -1, errdefs.Errorf(errdefs.ErrResourceExhausted, "no free address in %v", m.cfg.Subnet)
}

// release forgets id and frees its slot.
func (m *Manager) release(id string, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sandboxes[id] == e {
		delete(m.sandboxes, id)
	}
	if e.slot >= 0 && m.used[e.slot] == id {
		delete(m.used, e.slot)
	}
}

func (m *Manager) get(id string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sandboxes[id]
}

// Get returns the network of a sandbox this Manager set up or adopted.
func (m *Manager) Get(id string) (Sandbox, bool) {
	e := m.get(id)
	if e == nil {
		return Sandbox{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb, !e.gone
}

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

// Teardown removes everything of sandbox id: its egress, nftables chains,
// veth and namespace mount. It is idempotent and works for ids this
// Manager never saw (leftovers of an earlier daemon), finding them by
// name. If a step fails the others still run, and a later Teardown
// retries.
//
// For a sandbox of this Manager with a veth it returns once the egress is
// detached and the namespace unmounted (well under a millisecond); its
// chains and veth go in a background batch (reap.go), its address stays
// reserved until then, and Close and Reconcile wait for it.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if !validID(id) {
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
		if validID(id) {
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
		if a := l.Attrs(); m.ownsIface(a.Name) && !validID(a.Alias) && !m.spareIface(a.Name) {
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

// Close releases the Manager. If no sandbox network is left on the host it
// also deletes the nftables table; otherwise the table stays, so that
// sandboxes that outlive the daemon stay confined. It does not tear
// sandboxes down.
func (m *Manager) Close(ctx context.Context) error {
	m.removeSpares(true)
	m.waitReaped()
	defer m.nl.Close()
	ids, err := m.List(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return nil
	}
	return m.nft.deleteTable()
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}
