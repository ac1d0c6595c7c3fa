package egress

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
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
	seen  []seenRequest
}

// seenRequest is a request a test web server received.
type seenRequest struct {
	server string // "a" or "b"
	proto  string
	tls    bool
	header http.Header
	body   string
}

const (
	addrA = "198.18.0.10"
	addrB = "198.18.0.11"
)

func localIPv4(t testing.TB) string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

func newFixture(t testing.TB, p Policy, opts ...func(*Config)) *fixture {
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
		plain := httptest.NewServer(f.recorder(s.label))
		t.Cleanup(plain.Close)
		secure := httptest.NewUnstartedServer(f.recorder(s.label))
		secure.EnableHTTP2 = true
		secure.TLS = &tls.Config{Certificates: []tls.Certificate{f.certs.Server}}
		secure.Config.ErrorLog = log.New(io.Discard, "", 0)
		secure.StartTLS()
		t.Cleanup(secure.Close)
		web[netip.AddrPortFrom(netip.MustParseAddr(s.ip), 80)] = plain.Listener.Addr().String()
		web[netip.AddrPortFrom(netip.MustParseAddr(s.ip), 443)] = secure.Listener.Addr().String()
	}
	cfg := Config{
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
	}
	cfg.UpstreamRoots = f.certs.Pool
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := New(cfg)
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

// recorder wraps nettest.EchoHandler: it records every request, answers
// POST /body with the body it received, and accepts a WebSocket handshake
// on /ws (answering with the Authorization header it got, then echoing).
func (f *fixture) recorder(label string) http.Handler {
	echo := nettest.EchoHandler(label)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.seen = append(f.seen, seenRequest{server: label, proto: r.Proto, tls: r.TLS != nil, header: r.Header.Clone(), body: string(body)})
		f.mu.Unlock()
		switch r.URL.Path {
		case "/body":
			_, _ = w.Write(body)
		case "/ws":
			serveTestWebSocket(w, r)
		default:
			echo.ServeHTTP(w, r)
		}
	})
}

// serveTestWebSocket completes an RFC 6455 §4.2.2 opening handshake and
// then echoes raw bytes; the tests need the upgrade, not the framing.
func serveTestWebSocket(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "not a websocket handshake", http.StatusBadRequest)
		return
	}
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\nX-Seen-Authorization: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]), r.Header.Get("Authorization"))
	_ = brw.Flush()
	_, _ = io.Copy(c, brw)
}

// Seen returns the requests the web servers received.
func (f *fixture) Seen() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

// lastSeen returns the last request a web server received.
func (f *fixture) lastSeen(t testing.TB) seenRequest {
	t.Helper()
	s := f.Seen()
	if len(s) == 0 {
		t.Fatal("no request reached a web server")
	}
	return s[len(s)-1]
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
