package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DaemonNetwork is a test daemon's own share of the host's network
// objects: a subnet no route uses, an interface name prefix and an
// nftables table, so that daemons of parallel tests (and a real daemon on
// the host) never touch each other's sandbox networks.
type DaemonNetwork struct {
	Subnet netip.Prefix
	Prefix string
	Table  string
}

// NewDaemonNetwork picks a free /22 in 172.16.0.0/12 (the network
// package's own tests use 10.192.0.0/10) and random names.
func NewDaemonNetwork(t testing.TB) DaemonNetwork {
	t.Helper()
	var routes []netlink.Route
	err := redump(func() (err error) {
		routes, err = netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	for range 100 {
		v, _ := rand.Int(rand.Reader, big.NewInt(1024))
		n := v.Int64()
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + n/64), byte(n%64) * 4, 0}), 22)
		free := true
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
				ones, _ := r.Dst.Mask.Size()
				if ones > 0 && p.Overlaps(netip.PrefixFrom(a, ones)) {
					free = false
				}
			}
		}
		if free {
			return DaemonNetwork{Subnet: p, Prefix: "ct" + id, Table: "corral-test-" + id}
		}
	}
	t.Fatal("no free subnet for a test daemon")
	return DaemonNetwork{}
}

// Args are the daemon flags for n. Unless extra (the test's other flags)
// names a DNS upstream, sandboxes' lookups go to a closed loopback port:
// tests never send a query to the host's resolver.
func (n DaemonNetwork) Args(extra []string) []string {
	out := []string{"--network-subnet", n.Subnet.String(), "--network-prefix", n.Prefix, "--nft-table", n.Table}
	if !slices.Contains(extra, "--dns-upstream") {
		out = append(out, "--dns-upstream", "127.0.0.1:1")
	}
	return out
}

// Leftovers lists the daemon's network objects still on the host:
// interfaces with its prefix, its nftables table, addresses and routes in
// its subnet. Namespace mounts live under the daemon's state dir, which
// Mounts covers.
func (n DaemonNetwork) Leftovers(t testing.TB) []string {
	t.Helper()
	var out []string
	var links []netlink.Link
	if err := redump(func() (err error) { links, err = netlink.LinkList(); return err }); err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, n.Prefix) {
			out = append(out, "link "+name)
		}
	}
	var addrs []netlink.Addr
	_ = redump(func() (err error) { addrs, err = netlink.AddrList(nil, unix.AF_INET); return err })
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && n.Subnet.Contains(ip) {
			out = append(out, "address "+ip.String())
		}
	}
	var routes []netlink.Route
	_ = redump(func() (err error) {
		routes, err = netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		return err
	})
	for _, r := range routes {
		if r.Dst != nil {
			if ip, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && n.Subnet.Contains(ip) {
				out = append(out, "route "+r.Dst.String())
			}
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, tb := range tables {
		if tb.Name == n.Table {
			out = append(out, "nft table "+tb.Name)
		}
	}
	return out
}

// redump runs a netlink dump again while other processes' changes
// interrupt it (netlink.ErrDumpInterrupted): a partial list would hide
// leftovers or pick a subnet in use.
func redump(dump func() error) error {
	var err error
	for range 5 {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}

// FreeLoopbackAddr returns a 127.0.0.1 address with a TCP port nothing
// listens on, for a daemon the test starts to listen on. The port comes
// from below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// 32768 and up by default): a port found free by listening on port 0 and
// closing is an ephemeral one, which any outgoing connection may take
// before the daemon binds it; one below the range is only ever taken by
// an explicit bind.
func FreeLoopbackAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		n, err := rand.Int(rand.Reader, big.NewInt(32768-20000))
		if err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+int(n.Int64())))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port between 20000 and 32767")
	return ""
}
