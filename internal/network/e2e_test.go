package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/network/nettest"
	"github.com/corralrun/corral/internal/testutil"
)

// world is a test's internet, resolver, egress server and Manager.
type world struct {
	cfg Config
	in  *nettest.Internet
	up  *nettest.Upstream
	srv *egress.Server
	m   *Manager
	log *testutil.SyncBuffer
}

func newWorld(t testing.TB, opts ...func(*egress.Config)) *world {
	t.Helper()
	cfg := testConfig(t)
	w := &world{cfg: cfg, log: &testutil.SyncBuffer{}}
	w.in = nettest.NewInternet(t, "cti"+randLetters(5), "allowed.test", "other.test", "api.example.test")
	w.in.EnableForwarding(t)
	a, b := w.in.A.String(), w.in.B.String()
	w.up = nettest.StartUpstream(t, map[string][]string{
		"allowed.test":     {a},
		"other.test":       {b},
		"api.example.test": {a},
		"rebind.test":      {"127.0.0.1"},
		"meta.test":        {"169.254.169.254"},
		"private.test":     {"10.1.2.3"},
	})
	ecfg := egress.Config{
		Upstreams:     []netip.AddrPort{w.up.Addr},
		Ports:         egress.DefaultServerPorts(),
		Logger:        slog.New(slog.NewTextHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Dial:          w.in.Dial,
		UpstreamRoots: w.in.Certs.Pool,
	}
	for _, o := range opts {
		o(&ecfg)
	}
	srv, err := egress.New(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() }) // after the Manager's cleanup, which runs first
	w.srv = srv
	cfg.Egress = srv
	w.m = newTestManager(t, cfg)
	return w
}

// inside is a client running in a sandbox's namespace.
type inside struct {
	t   testing.TB
	ns  *nettest.NS
	sb  *Sandbox
	w   *world
	dns string
}

func (w *world) sandbox(t testing.TB, id string, p egress.Policy) *inside {
	t.Helper()
	sb, err := w.m.Setup(t.Context(), id, p)
	if err != nil {
		t.Fatal(err)
	}
	return &inside{t: t, ns: nettest.OpenNS(t, sb.NetNSPath), sb: sb, w: w, dns: netip.AddrPortFrom(sb.HostAddr, 53).String()}
}

// query sends one DNS query from inside the sandbox to server.
func (s *inside) query(server, name string, qtype uint16) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(s.t.Context(), 3*time.Second)
	defer cancel()
	c, err := s.ns.Dial(ctx, "udp4", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	co := &dns.Conn{Conn: c}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

func (s *inside) lookup(name string) (string, error) {
	m, err := s.query(s.dns, name, dns.TypeA)
	if err != nil {
		return "", err
	}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), nil
		}
	}
	return "", fmt.Errorf("%s: %s with %d answers", name, dns.RcodeToString[m.Rcode], len(m.Answer))
}

func (s *inside) dial(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return s.ns.Dial(ctx, "tcp4", addr)
}

// client resolves names through the sandbox's DNS and connects from
// inside the sandbox, like any program there.
func (s *inside) client() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if _, err := netip.ParseAddr(host); err != nil {
				if host, err = s.lookup(host); err != nil {
					return nil, err
				}
			}
			return s.dial(ctx, net.JoinHostPort(host, port))
		},
		TLSClientConfig:   &tls.Config{RootCAs: s.w.in.Certs.Pool},
		DisableKeepAlives: true,
	}}
}

// proxyClient uses the sandbox's HTTP_PROXY.
func (s *inside) proxyClient() *http.Client {
	var proxy *url.URL
	for _, kv := range s.sb.ProxyEnv() {
		if v, ok := strings.CutPrefix(kv, "HTTP_PROXY="); ok {
			proxy, _ = url.Parse(v)
		}
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxy),
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return s.dial(ctx, addr) },
		TLSClientConfig:   &tls.Config{RootCAs: s.w.in.Certs.Pool},
		DisableKeepAlives: true,
	}}
}

func (s *inside) get(c *http.Client, rawURL, host string, hdr ...string) (int, string) {
	req, err := http.NewRequestWithContext(s.t.Context(), "GET", rawURL, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tlsGet connects to addr from inside the sandbox, handshakes with sni and
// sends one request with Host host.
func (s *inside) tlsGet(addr, sni, host string) (string, error) {
	c, err := s.dial(s.t.Context(), addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: s.w.in.Certs.Pool, InsecureSkipVerify: sni == ""})
	if err := tc.HandshakeContext(s.t.Context()); err != nil {
		return "", err
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), nil
}

// refused reports whether err is the clear, immediate error host-side
// rules give a TCP connection: a reset (ECONNREFUSED). Every target the
// tests use this for has a listener, so the reset comes from the rules.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func TestEgressEndToEnd(t *testing.T) {
	w := newWorld(t)
	a, b := w.in.A.String(), w.in.B.String()
	policy := egress.Policy{Mode: egress.ModeAllowlist,
		Domains: []egress.DomainRule{{Name: "allowed.test"}, {Name: "api.example.test"}, {Name: "rebind.test"}, {Name: "meta.test"}, {Name: "private.test"}},
		Headers: []egress.HeaderRule{{Domain: "api.example.test", Name: "Authorization", Value: "Bearer secret"}},
	}
	s := w.sandbox(t, "e2e", policy)
	peer := w.sandbox(t, "peer", allowlist())
	c := s.client()

	t.Run("dns", func(t *testing.T) {
		long := strings.Repeat("x", 60)
		for _, tc := range []struct {
			server, name string
			qtype        uint16
			rcode        int
			answers      int
		}{
			{s.dns, "allowed.test", dns.TypeA, dns.RcodeSuccess, 1},
			{s.dns, "other.test", dns.TypeA, dns.RcodeNameError, 0},
			{s.dns, "allowed.test", dns.TypeTXT, dns.RcodeRefused, 0},
			{s.dns, "allowed.test", dns.TypeANY, dns.RcodeRefused, 0},
			{s.dns, long + ".allowed.test", dns.TypeA, dns.RcodeRefused, 0},
			{s.dns, long + ".exfil.test", dns.TypeA, dns.RcodeRefused, 0},
			{s.dns, "rebind.test", dns.TypeA, dns.RcodeSuccess, 0},
			{s.dns, "meta.test", dns.TypeA, dns.RcodeSuccess, 0},
			{s.dns, "private.test", dns.TypeA, dns.RcodeSuccess, 0},
			// A resolver the sandbox picks itself is redirected to its own.
			{net.JoinHostPort(a, "53"), "allowed.test", dns.TypeA, dns.RcodeSuccess, 1},
			{net.JoinHostPort(a, "53"), "other.test", dns.TypeA, dns.RcodeNameError, 0},
		} {
			m, err := s.query(tc.server, tc.name, tc.qtype)
			if err != nil {
				t.Errorf("%s %s via %s: %v", tc.name, dns.TypeToString[tc.qtype], tc.server, err)
				continue
			}
			if m.Rcode != tc.rcode || len(m.Answer) != tc.answers {
				t.Errorf("%s %s via %s: %s with %d answers, want %s with %d", tc.name, dns.TypeToString[tc.qtype], tc.server,
					dns.RcodeToString[m.Rcode], len(m.Answer), dns.RcodeToString[tc.rcode], tc.answers)
			}
		}
		for _, q := range w.up.Asked() {
			if !strings.HasSuffix(q, "/A") || strings.Contains(q, "other.test") || strings.Contains(q, long) {
				t.Errorf("upstream was asked %q; refused queries must not leave the host", q)
			}
		}
	})

	t.Run("allowed over http and https", func(t *testing.T) {
		if status, body := s.get(c, "http://allowed.test/", ""); status != 200 || nettest.Field(body, "server") != "a" {
			t.Errorf("http: %d %q", status, body)
		}
		if status, body := s.get(c, "https://allowed.test/", ""); status != 200 || nettest.Field(body, "sni") != "allowed.test" {
			t.Errorf("https: %d %q", status, body)
		}
	})

	t.Run("other domain refused", func(t *testing.T) {
		if status, body := s.get(c, "http://"+b+"/", "other.test"); status != 403 ||
			!strings.Contains(body, "corral: egress to other.test is not allowed by this sandbox's network policy") {
			t.Errorf("http: %d %q", status, body)
		}
		if _, err := s.tlsGet(b+":443", "other.test", "other.test"); err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("https: %v, want a TLS access_denied alert", err)
		}
	})

	t.Run("Host other on an allowed address refused", func(t *testing.T) {
		if status, body := s.get(c, "http://"+a+"/", "other.test"); status != 403 {
			t.Errorf("%d %q", status, body)
		}
	})

	// The proxy dials the SNI name, never the address the sandbox chose.
	t.Run("SNI allowed to another address reaches the allowed server", func(t *testing.T) {
		body, err := s.tlsGet(b+":443", "allowed.test", "allowed.test")
		if err != nil || nettest.Field(body, "server") != "a" {
			t.Errorf("%q %v", body, err)
		}
	})

	// Domain fronting: inside TLS the Host header is invisible. The request
	// reaches allowed.test's server (the SNI), never other.test's.
	t.Run("SNI allowed, Host other: reaches only the SNI's server", func(t *testing.T) {
		body, err := s.tlsGet(a+":443", "allowed.test", "other.test")
		if err != nil || nettest.Field(body, "server") != "a" || nettest.Field(body, "host") != "other.test" {
			t.Errorf("%q %v", body, err)
		}
	})

	t.Run("direct connections to an address", func(t *testing.T) {
		if status, body := s.get(c, "http://"+a+"/", ""); status != 403 {
			t.Errorf("http by address: %d %q", status, body)
		}
		if _, err := s.tlsGet(a+":443", "", "allowed.test"); err == nil {
			t.Error("TLS without SNI succeeded")
		}
		if _, err := s.dial(t.Context(), a+":8080"); !refused(err) {
			t.Errorf("TCP to another port: %v, want refused", err)
		}
		uc, err := s.ns.Dial(t.Context(), "udp4", a+":9999")
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		_, _ = uc.Write([]byte("exfil"))
		_ = uc.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := uc.Read(make([]byte, 16)); !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to an address: %v, want an ICMP error", err)
		}
	})

	t.Run("metadata address", func(t *testing.T) {
		if status, body := s.get(c, "http://169.254.169.254/latest/meta-data/", ""); status != 403 {
			t.Errorf("http: %d %q", status, body)
		}
		if status, body := s.get(c, "http://"+b+"/", "meta.test"); status != 403 || !strings.Contains(body, "blocked addresses") {
			t.Errorf("name resolving to it: %d %q", status, body)
		}
	})

	t.Run("rebinding name", func(t *testing.T) {
		if status, body := s.get(c, "http://"+b+"/", "rebind.test"); status != 403 || !strings.Contains(body, "blocked addresses") {
			t.Errorf("%d %q", status, body)
		}
		if status, _ := s.get(s.proxyClient(), "https://rebind.test/", ""); status != 0 {
			t.Errorf("CONNECT rebind.test: status %d", status)
		}
	})

	t.Run("host services", func(t *testing.T) {
		// A host service listening on the sandbox's gateway address.
		ln, err := net.Listen("tcp4", netip.AddrPortFrom(s.sb.HostAddr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if _, err := s.dial(t.Context(), ln.Addr().String()); !refused(err) {
			t.Errorf("host service on the gateway: %v, want refused", err)
		}
		if _, err := s.dial(t.Context(), w.up.Addr.String()); !refused(err) {
			t.Errorf("host loopback address: %v, want refused", err)
		}
		if ip := hostAddress(t); ip.IsValid() {
			ln2, err := net.Listen("tcp4", netip.AddrPortFrom(ip, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			defer ln2.Close()
			if _, err := s.dial(t.Context(), ln2.Addr().String()); !refused(err) {
				t.Errorf("host's own address %s: %v, want refused", ip, err)
			}
		}
	})

	t.Run("another sandbox", func(t *testing.T) {
		ln, err := peer.ns.Listen("tcp4", netip.AddrPortFrom(peer.sb.Addr.Addr(), 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if _, err := s.dial(t.Context(), ln.Addr().String()); !refused(err) {
			t.Errorf("peer sandbox: %v, want refused", err)
		}
		if _, err := s.dial(t.Context(), netip.AddrPortFrom(peer.sb.HostAddr, peer.sb.Ports.HTTPProxy).String()); !refused(err) {
			t.Errorf("peer's proxy: %v, want refused", err)
		}
	})

	t.Run("ipv6", func(t *testing.T) {
		if _, err := s.ns.Dial(t.Context(), "tcp6", "[2001:db8::1]:80"); err == nil {
			t.Error("IPv6 connection from the sandbox succeeded")
		}
		testIPv6Filtered(t, w, s)
	})

	t.Run("secrets", func(t *testing.T) {
		if status, body := s.get(c, "http://api.example.test/", "", "Authorization", "Bearer from-sandbox"); status != 200 || !strings.Contains(body, "auth=Bearer secret") {
			t.Errorf("http: %d %q", status, body)
		}
		if status, body := s.get(s.proxyClient(), "http://api.example.test/", ""); status != 200 || !strings.Contains(body, "auth=Bearer secret") {
			t.Errorf("explicit proxy: %d %q", status, body)
		}
		// Without a CA, HTTPS is not intercepted: nothing is injected.
		if status, body := s.get(c, "https://api.example.test/", ""); status != 200 || !strings.Contains(body, "auth=\n") {
			t.Errorf("https: %d %q", status, body)
		}
	})

	t.Run("explicit proxy", func(t *testing.T) {
		pc := s.proxyClient()
		if status, body := s.get(pc, "https://allowed.test/", ""); status != 200 || nettest.Field(body, "sni") != "allowed.test" {
			t.Errorf("CONNECT allowed: %d %q", status, body)
		}
		if status, body := s.get(pc, "https://other.test/", ""); status != 0 || !strings.Contains(body, "Forbidden") {
			t.Errorf("CONNECT other: %d %q", status, body)
		}
		if status, _ := s.get(pc, "http://other.test/", ""); status != 403 {
			t.Errorf("GET other: %d", status)
		}
	})

	t.Run("live update", func(t *testing.T) {
		p := policy
		p.Domains = append(slices.Clone(p.Domains), egress.DomainRule{Name: "other.test"})
		start := time.Now()
		if err := w.m.Update(t.Context(), "e2e", p); err != nil {
			t.Fatal(err)
		}
		if ip, err := s.lookup("other.test"); err != nil || ip != b {
			t.Errorf("DNS after update: %q %v", ip, err)
		}
		if status, body := s.get(c, "https://other.test/", ""); status != 200 || nettest.Field(body, "server") != "b" {
			t.Errorf("https after update: %d %q", status, body)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("update took %v to take effect, want under a second", d)
		}
		t.Logf("update effective after %v", time.Since(start))
		if err := w.m.Update(t.Context(), "e2e", policy); err != nil {
			t.Fatal(err)
		}
		if status, _ := s.get(c, "http://"+b+"/", "other.test"); status != 403 {
			t.Errorf("after revert: %d", status)
		}
	})

	t.Run("decisions are logged", func(t *testing.T) {
		logs := w.log.String()
		for _, want := range []string{"sandbox_id=e2e via=host host=allowed.test allowed=true", "sandbox_id=e2e via=sni host=other.test", "allowed=false"} {
			if !strings.Contains(logs, want) {
				t.Errorf("log lacks %q", want)
			}
		}
		if strings.Contains(logs, "Bearer secret") {
			t.Error("the injected secret appears in the logs")
		}
	})

	for _, d := range w.in.Dials() {
		if d.Addr() != w.in.A && d.Addr() != w.in.B {
			t.Errorf("proxy dialed %s", d)
		}
	}
}

// hostAddress returns a global IPv4 address of the host (not loopback, not
// a test interface), if any.
func hostAddress(t testing.TB) netip.Addr {
	addrs, _ := netlink.AddrList(nil, unix.AF_INET)
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if ip.IsValid() && !ip.IsLoopback() && a.Scope == unix.RT_SCOPE_UNIVERSE && !netip.MustParsePrefix("10.0.0.0/8").Contains(ip) && !netip.MustParsePrefix("198.18.0.0/15").Contains(ip) {
			return ip
		}
	}
	return netip.Addr{}
}

// testIPv6Filtered plays a runtime that ignores the namespace's sysctls
// (gVisor's netstack does): IPv6 is switched on at both ends of the veth
// with addresses, and a host listener waits on the host end. The
// connection must still fail, because the sandbox's nftables chains drop
// all IPv6. A control veth pair outside the Manager, set up the same way,
// shows the connection would otherwise work.
func testIPv6Filtered(t *testing.T, w *world, s *inside) {
	try := func(hostIf string, ns *nettest.NS, sandboxIf string, prefix string) error {
		hostAddr, sbAddr := netip.MustParseAddr(prefix+"1"), netip.MustParseAddr(prefix+"2")
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6", []byte("0"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"all", sandboxIf} {
			if err := ns.WriteSysctl("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", "0"); err != nil {
				t.Fatal(err)
			}
		}
		hl, err := netlink.LinkByName(hostIf)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: &net.IPNet{IP: hostAddr.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
		nh := ns.Netlink(t)
		el, err := nh.LinkByName(sandboxIf)
		if err != nil {
			t.Fatal(err)
		}
		if err := nh.AddrAdd(el, &netlink.Addr{IPNet: &net.IPNet{IP: sbAddr.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp6", netip.AddrPortFrom(hostAddr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		c, err := ns.Dial(ctx, "tcp6", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}

	// Control: a plain veth pair into a fresh namespace.
	ctl := nettest.NewNS(t)
	name := "ctv6" + randLetters(4)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ctl.Fd())}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	hl, _ := netlink.LinkByName(name)
	_ = netlink.LinkSetUp(hl)
	nh := ctl.Netlink(t)
	el, _ := nh.LinkByName("eth0")
	_ = nh.LinkSetUp(el)
	if err := try(name, ctl, "eth0", "fd00:c0:ffee:1::"); err != nil {
		t.Fatalf("control: IPv6 over a plain veth failed (%v); the test setup is broken", err)
	}
	if err := try(s.sb.HostIface, s.ns, "eth0", "fd00:c0:ffee:2::"); err == nil {
		t.Error("IPv6 from the sandbox to its host end succeeded; nftables must drop it")
	}
}

func TestModeNoneEndToEnd(t *testing.T) {
	w := newWorld(t)
	s := w.sandbox(t, "isolated", egress.Policy{Mode: egress.ModeNone})
	if names := linkNames(t, s.ns.Netlink(t)); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("links %v, want lo only", names)
	}
	if _, err := s.dial(t.Context(), w.in.A.String()+":80"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("dial out: %v, want network unreachable", err)
	}
	ln, err := s.ns.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := s.dial(t.Context(), ln.Addr().String())
	if err != nil {
		t.Errorf("loopback inside: %v", err)
	} else {
		c.Close()
	}
	if got := s.sb.ResolvConf(); got != "nameserver 127.0.0.1\n" {
		t.Errorf("ResolvConf = %q", got)
	}
}

// TestCIDRRuleEndToEnd forwards a CIDR-allowed destination directly
// (forwarding and masquerade), and still refuses blocked ranges.
func TestCIDRRuleEndToEnd(t *testing.T) {
	w := newWorld(t)
	s := w.sandbox(t, "cidr", egress.Policy{Mode: egress.ModeAllowlist,
		CIDRs: []egress.CIDRRule{{Prefix: netip.PrefixFrom(w.in.B, 32), Ports: []uint16{8080}}}})
	peer := w.sandbox(t, "peer", allowlist())
	c := s.client()
	if status, body := s.get(c, "http://"+w.in.B.String()+":8080/", ""); status != 200 || nettest.Field(body, "server") != "b" {
		t.Errorf("CIDR-allowed destination: %d %q", status, body)
	}
	if _, err := s.dial(t.Context(), w.in.A.String()+":8080"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("same port on another address: %v, want connection refused (TCP reset)", err)
	}
	ln, err := peer.ns.Listen("tcp4", netip.AddrPortFrom(peer.sb.Addr.Addr(), 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := s.dial(t.Context(), ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("another sandbox with forwarding on: %v, want connection refused (TCP reset)", err)
	}
	if len(w.in.Dials()) != 0 {
		t.Errorf("the proxy dialed %v for direct traffic", w.in.Dials())
	}
}

// With a CA, HTTPS to a rule's domain is intercepted through the real
// redirect and the CONNECT proxy; other names keep their own certificate.
func TestEgressInterceptEndToEnd(t *testing.T) {
	ca, err := egress.LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, func(c *egress.Config) { c.CA = ca })
	if w.m.CA() != ca {
		t.Fatal("Manager.CA does not return the egress Server's CA")
	}
	s := w.sandbox(t, "tls", egress.Policy{Mode: egress.ModeAllowlist,
		Domains: []egress.DomainRule{{Name: "allowed.test"}, {Name: "api.example.test"}},
		Headers: []egress.HeaderRule{{Domain: "api.example.test", Name: "Authorization", Value: "Bearer secret"}},
	})
	pool := w.in.Certs.Pool.Clone()
	pool.AppendCertsFromPEM(ca.CertPEM())
	for name, c := range map[string]*http.Client{"transparent": s.client(), "connect": s.proxyClient()} {
		tr := c.Transport.(*http.Transport)
		tr.TLSClientConfig.RootCAs = pool
		tr.ForceAttemptHTTP2 = true
		if status, body := s.get(c, "https://api.example.test/", "", "Authorization", "Bearer mine"); status != 200 || !strings.Contains(body, "auth=Bearer secret\n") || nettest.Field(body, "sni") != "api.example.test" {
			t.Errorf("%s: intercepted: %d %q", name, status, body)
		}
		resp, err := c.Get("https://allowed.test/")
		if err != nil {
			t.Fatalf("%s: spliced: %v", name, err)
		}
		resp.Body.Close()
		if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != "corral test CA" {
			t.Errorf("%s: allowed.test answered with a certificate from %q, want the server's own", name, got)
		}
	}
	if !strings.Contains(w.log.String(), "sandbox_id=tls via=sni host=api.example.test allowed=true intercepted=true") {
		t.Errorf("no interception logged:\n%s", w.log)
	}
}
