package nettest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Internet is a test's own internet: a namespace holding two server
// addresses, each serving HTTP on 80 and 8080 and HTTPS on 443, joined to
// the root namespace by a veth whose root end owns the first address of a
// /24 in the benchmarking range 198.18.0.0/15. The connected route of that
// /24 is the only way in. Everything is removed when the test ends.
type Internet struct {
	NS     *NS
	Prefix netip.Prefix // 198.18.x.0/24
	Gate   netip.Addr   // the root namespace's end, .1
	// A and B are the two server addresses (.10 and .11); servers label
	// themselves "a" and "b" in their answers.
	A, B  netip.Addr
	Link  string // the root-namespace veth
	Certs *Certs

	mu    sync.Mutex
	dials []netip.AddrPort
}

// NewInternet builds an Internet with a root-namespace veth named link.
// Its HTTPS servers present a certificate for names.
func NewInternet(t testing.TB, link string, names ...string) *Internet {
	t.Helper()
	in := &Internet{NS: NewNS(t), Link: link, Certs: NewCerts(t, names...)}
	in.Prefix = freeTestPrefix(t)
	base := in.Prefix.Addr().As4()
	at := func(last byte) netip.Addr { b := base; b[3] = last; return netip.AddrFrom4(b) }
	in.Gate, in.A, in.B = at(1), at(10), at(11)

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: link},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(in.NS.Fd()),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("creating internet veth %s: %v", link, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(link); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+link+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(in.Gate, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	nh := in.NS.Netlink(t)
	eth, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{in.A, in.B} {
		if err := nh.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 24))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nh.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		addr  netip.Addr
		label string
	}{{in.A, "a"}, {in.B, "b"}} {
		in.serve(t, a.addr, 80, a.label, nil)
		in.serve(t, a.addr, 8080, a.label, nil)
		in.serve(t, a.addr, 443, a.label, &tls.Config{Certificates: []tls.Certificate{in.Certs.Server}})
	}
	return in
}

func (in *Internet) serve(t testing.TB, addr netip.Addr, port uint16, label string, tlsCfg *tls.Config) {
	t.Helper()
	ln, err := in.NS.Listen("tcp4", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		t.Fatalf("internet listen %s:%d: %v", addr, port, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	srv := &http.Server{Handler: EchoHandler(label), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// Dial is an egress.Config.Dial for tests: it connects only to addresses
// inside this Internet, records every attempt, and refuses anything else,
// so a proxy bug can never send test traffic to a real address.
func (in *Internet) Dial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	in.mu.Lock()
	in.dials = append(in.dials, a)
	in.mu.Unlock()
	if !in.Prefix.Contains(a.Addr()) {
		return nil, fmt.Errorf("test guard: refusing to dial %s outside the test internet", a)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp4", a.String())
}

// Dials returns every address the proxy tried to dial.
func (in *Internet) Dials() []netip.AddrPort {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]netip.AddrPort(nil), in.dials...)
}

// EnableForwarding lets packets that arrive from the Internet (replies to
// sandboxes with CIDR rules) be forwarded, on this interface only.
func (in *Internet) EnableForwarding(t testing.TB) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+in.Link+"/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// freeTestPrefix picks a random /24 in 198.18.0.0/15 that no host address
// or route uses.
func freeTestPrefix(t testing.TB) netip.Prefix {
	t.Helper()
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(nil, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for range 64 {
		n, _ := rand.Int(rand.Reader, big.NewInt(512))
		v := n.Int64()
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + byte(v/256), byte(v % 256), 0}), 24)
		used := false
		for _, r := range routes {
			if r.Dst != nil {
				if rp, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && p.Contains(rp) {
					used = true
				}
			}
		}
		for _, a := range addrs {
			if ap, ok := netip.AddrFromSlice(a.IP.To4()); ok && p.Contains(ap) {
				used = true
			}
		}
		if !used {
			return p
		}
	}
	t.Fatal(errors.New("no free /24 in 198.18.0.0/15"))
	return netip.Prefix{}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}
