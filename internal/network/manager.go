package network

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
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
	cfg, ports, err := checkConfig(cfg)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	m := newManager(cfg, ports, h)
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

// checkConfig fills in cfg's defaults and validates it, returning the
// ports the sandboxes' egress listens on.
func checkConfig(cfg Config) (Config, egress.Ports, error) {
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "crl"
	}
	if cfg.Table == "" {
		cfg.Table = "corral"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	invalid := func(format string, args ...any) (Config, egress.Ports, error) {
		return cfg, egress.Ports{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "network config: "+format, args...)
	}
	sub := cfg.Subnet
	if !sub.IsValid() || !sub.Addr().Is4() || sub.Bits() < 8 || sub.Bits() > 30 {
		return invalid("subnet %v: want an IPv4 prefix between /8 and /30", sub)
	}
	if !isPrivate(sub) {
		return invalid("subnet %v must lie inside 10/8, 172.16/12, 192.168/16 or 100.64/10", sub)
	}
	cfg.Subnet = sub.Masked()
	digits := len(strconv.Itoa(slotCount(cfg.Subnet) - 1))
	if !validPrefix(cfg.NamePrefix) || len(cfg.NamePrefix)+digits > unix.IFNAMSIZ-1 {
		return invalid("name prefix %q: want lower-case letters and digits, short enough for %d-digit slot numbers", cfg.NamePrefix, digits)
	}
	if !validTable(cfg.Table) {
		return invalid("table name %q", cfg.Table)
	}
	if cfg.StateDir == "" {
		return invalid("no state directory")
	}
	ports := cfg.Ports
	if cfg.Egress != nil {
		ports = cfg.Egress.Ports()
	}
	if ports.DNS == 0 || ports.Transparent == 0 || ports.HTTPProxy == 0 ||
		ports.DNS == ports.Transparent || ports.DNS == ports.HTTPProxy || ports.Transparent == ports.HTTPProxy ||
		ports.DNS == refusePort || ports.Transparent == refusePort || ports.HTTPProxy == refusePort {
		return invalid("ports %+v: all must be set, distinct, and not %d", ports, refusePort)
	}
	return cfg, ports, nil
}

// isPrivate reports whether sub lies inside a private or shared address
// range, so that sandbox addresses never shadow public ones.
func isPrivate(sub netip.Prefix) bool {
	for _, p := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"} {
		pp := netip.MustParsePrefix(p)
		if pp.Bits() <= sub.Bits() && pp.Contains(sub.Addr()) {
			return true
		}
	}
	return false
}

// slotCount is how many sandboxes with a veth fit in sub: each takes a /30.
func slotCount(sub netip.Prefix) int { return 1 << (32 - sub.Bits()) / 4 }

// newManager makes the Manager of a checked cfg on the netlink handle h.
func newManager(cfg Config, ports egress.Ports, h *netlink.Handle) *Manager {
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		ports:     ports,
		nl:        h,
		nft:       newNFT(cfg.Table, cfg.NamePrefix, cfg.Subnet),
		base:      binary.BigEndian.Uint32(cfg.Subnet.Addr().AsSlice()),
		slots:     slotCount(cfg.Subnet),
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
	return m
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

// CA returns the CA the egress proxy terminates HTTPS with for header and
// placeholder rules, or nil when it has none (or Config.Egress is not an
// *egress.Server). Sandboxes need its certificate (CertPEM) in their trust
// stores for intercepted names to work.
func (m *Manager) CA() *egress.CA {
	if e, ok := m.cfg.Egress.(interface{ CA() *egress.CA }); ok {
		return e.CA()
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
