package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/network/nettest"
	"github.com/corralrun/corral/internal/testutil"
)

// fixture is an egress Server with one sandbox attached on loopback, a test
// upstream resolver, and loopback web servers standing in for the
// internet. The Server's Dial maps the two test "internet" addresses to
// those servers and refuses everything else, recording every attempt.
type fixture struct {
	srv   *Server
	up    *nettest.Upstream
	addrs Addrs
	certs *nettest.Certs
	log   *testutil.SyncBuffer

	mu    sync.Mutex
	dials []netip.AddrPort
}

const (
	addrA = "198.18.0.10"
	addrB = "198.18.0.11"
)

func localIPv4(t *testing.T) string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

func newFixture(t *testing.T, p Policy) *fixture {
	t.Helper()
	records := map[string][]string{
		"allowed.test":     {addrA},
		"other.test":       {addrB},
		"api.example.test": {addrA},
		"a.wild.test":      {addrA},
		"rebind.test":      {"127.0.0.1"},
		"meta.test":        {"169.254.169.254"},
		"private.test":     {"10.1.2.3"},
		"mixed.test":       {"127.0.0.1", addrA},
	}
	if ip := localIPv4(t); ip != "" {
		records["self.test"] = []string{ip}
	}
	f := &fixture{
		up:    nettest.StartUpstream(t, records),
		certs: nettest.NewCerts(t, "allowed.test", "other.test", "api.example.test", "a.wild.test"),
		log:   &testutil.SyncBuffer{},
	}
	web := map[netip.AddrPort]string{}
	for _, s := range []struct {
		ip, label string
	}{{addrA, "a"}, {addrB, "b"}} {
		plain := httptest.NewServer(nettest.EchoHandler(s.label))
		t.Cleanup(plain.Close)
		secure := httptest.NewUnstartedServer(nettest.EchoHandler(s.label))
		secure.TLS = &tls.Config{Certificates: []tls.Certificate{f.certs.Server}}
		secure.Config.ErrorLog = log.New(io.Discard, "", 0)
		secure.StartTLS()
		t.Cleanup(secure.Close)
		web[netip.AddrPortFrom(netip.MustParseAddr(s.ip), 80)] = plain.Listener.Addr().String()
		web[netip.AddrPortFrom(netip.MustParseAddr(s.ip), 443)] = secure.Listener.Addr().String()
	}
	srv, err := New(Config{
		Upstreams: []netip.AddrPort{f.up.Addr},
		Logger:    slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Dial: func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			f.mu.Lock()
			f.dials = append(f.dials, a)
			f.mu.Unlock()
			target, ok := web[a]
			if !ok {
				return nil, fmt.Errorf("test guard: refusing to dial %s", a)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", target)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	f.srv = srv
	f.addrs, err = srv.Attach(t.Context(), "sb1", netip.MustParseAddr("127.0.0.1"), p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Dials returns the addresses the proxy dialed.
func (f *fixture) Dials() []netip.AddrPort {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]netip.AddrPort(nil), f.dials...)
}

// transparentClient behaves like a sandbox whose every TCP connection is
// redirected to the transparent proxy.
func (f *fixture) transparentClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", f.addrs.Transparent.String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: f.certs.Pool},
		DisableKeepAlives: true,
	}}
}

// proxyClient uses the explicit proxy, as HTTP_PROXY users do.
func (f *fixture) proxyClient() *http.Client {
	u := &url.URL{Scheme: "http", Host: f.addrs.HTTPProxy.String()}
	return &http.Client{Transport: &http.Transport{
		Proxy:             http.ProxyURL(u),
		TLSClientConfig:   &tls.Config{RootCAs: f.certs.Pool},
		DisableKeepAlives: true,
	}}
}
