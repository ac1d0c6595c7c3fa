package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/network/nettest"
)

func get(t *testing.T, c *http.Client, url string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
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

func basePolicy() Policy {
	return Policy{Mode: ModeAllowlist,
		Domains: []DomainRule{{Name: "allowed.test"}, {Name: "api.example.test"}, {Name: "rebind.test"}, {Name: "meta.test"}, {Name: "mixed.test"}, {Name: "self.test"}},
		Headers: []HeaderRule{{Domain: "api.example.test", Name: "Authorization", Value: "Bearer secret"}},
	}
}

func TestTransparentHTTP(t *testing.T) {
	f := newFixture(t, basePolicy())
	c := f.transparentClient()
	tests := []struct {
		name       string
		url        string
		hdr        []string
		wantStatus int
		wantBody   string // substring
	}{
		{"allowed", "http://allowed.test/", nil, 200, "server=a local=127.0.0.1"},
		{"allowed host with port 80", "http://allowed.test:80/", nil, 200, "host=allowed.test:80"},
		{"other refused", "http://other.test/", nil, 403, "corral: egress to other.test is not allowed by this sandbox's network policy"},
		{"allowed name on a port not allowed", "http://allowed.test:8080/", nil, 403, "allowed.test port 8080"},
		{"ip literal", "http://" + addrA + "/", nil, 403, "egress to " + addrA + " is not allowed"},
		{"rebinding to loopback", "http://rebind.test/", nil, 403, "resolves only to blocked addresses"},
		{"rebinding to metadata", "http://meta.test/", nil, 403, "resolves only to blocked addresses"},
		{"metadata literal", "http://169.254.169.254/latest/meta-data/", nil, 403, "egress to 169.254.169.254 is not allowed"},
		{"loopback literal", "http://127.0.0.1:22/", nil, 403, "egress to 127.0.0.1 is not allowed"},
		{"mixed answer uses public address", "http://mixed.test/", nil, 200, "server=a"},
		{"secret injected", "http://api.example.test/", []string{"Authorization", "Bearer from-sandbox"}, 200, "auth=Bearer secret"},
		{"secret not sent elsewhere", "http://allowed.test/", nil, 200, "auth=\n"},
	}
	if localIPv4(t) != "" {
		tests = append(tests, struct {
			name       string
			url        string
			hdr        []string
			wantStatus int
			wantBody   string
		}{"name resolving to the host itself", "http://self.test/", nil, 403, "resolves only to blocked addresses"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := get(t, c, tt.url, tt.hdr...)
			if status != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tt.url, status, body, tt.wantStatus, tt.wantBody)
			}
		})
	}
	for _, d := range f.Dials() {
		if d.Addr() != netip.MustParseAddr(addrA) {
			t.Errorf("proxy dialed %s; only %s may be dialed", d, addrA)
		}
	}
	logs := f.log.String()
	for _, want := range []string{"sandbox_id=sb1 via=host host=allowed.test allowed=true", "sandbox_id=sb1 via=host host=other.test allowed=false"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "Bearer secret") {
		t.Error("the injected secret appears in the logs")
	}
}

// A keep-alive connection that starts with an allowed Host cannot switch
// to another host: every request is judged.
func TestTransparentKeepAliveCannotSwitchHost(t *testing.T) {
	f := newFixture(t, basePolicy())
	conn, err := net.Dial("tcp", f.addrs.Transparent.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for _, tc := range []struct {
		host string
		want int
	}{{"allowed.test", 200}, {"other.test", 403}, {"allowed.test", 200}} {
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", tc.host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Host %s: status %d, want %d", tc.host, resp.StatusCode, tc.want)
		}
	}
}

func tlsDial(t *testing.T, f *fixture, sni string) (*tls.Conn, error) {
	t.Helper()
	raw, err := net.Dial("tcp", f.addrs.Transparent.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	c := tls.Client(raw, &tls.Config{ServerName: sni, RootCAs: f.certs.Pool, InsecureSkipVerify: sni == ""})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return c, c.HandshakeContext(ctx)
}

func TestTransparentTLS(t *testing.T) {
	f := newFixture(t, basePolicy())
	t.Run("allowed", func(t *testing.T) {
		status, body := get(t, f.transparentClient(), "https://allowed.test/")
		if status != 200 || nettest.Field(body, "sni") != "allowed.test" || nettest.Field(body, "server") != "a" {
			t.Errorf("got %d %q", status, body)
		}
	})
	t.Run("other refused with access_denied", func(t *testing.T) {
		_, err := tlsDial(t, f, "other.test")
		if err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("handshake error = %v, want a TLS access_denied alert", err)
		}
	})
	t.Run("no SNI refused", func(t *testing.T) {
		if _, err := tlsDial(t, f, ""); err == nil {
			t.Error("handshake without SNI succeeded")
		}
	})
	t.Run("rebinding refused", func(t *testing.T) {
		if _, err := tlsDial(t, f, "rebind.test"); err == nil {
			t.Error("handshake to a name resolving to loopback succeeded")
		}
	})
	t.Run("not TLS after 0x16", func(t *testing.T) {
		c, err := net.Dial("tcp", f.addrs.Transparent.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("\x16\x03\x01\x00\x05hello"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("malformed hello: connection not closed: %v", err)
		}
	})
	// Domain fronting: inside TLS the proxy cannot see the Host header. The
	// connection goes to the SNI name (dialed by the proxy), so the request
	// reaches allowed.test's server, which sees Host other.test and may
	// refuse it; other.test's server is never contacted.
	t.Run("SNI allowed, Host other: reaches the SNI's server only", func(t *testing.T) {
		status, body := get(t, f.transparentClient(), "https://allowed.test/", "Host", "other.test")
		if status != 200 || nettest.Field(body, "server") != "a" || nettest.Field(body, "host") != "other.test" {
			t.Errorf("got %d %q", status, body)
		}
	})
	for _, d := range f.Dials() {
		if d.Addr() != netip.MustParseAddr(addrA) {
			t.Errorf("proxy dialed %s; only %s may be dialed", d, addrA)
		}
	}
}

func TestExplicitProxy(t *testing.T) {
	f := newFixture(t, basePolicy())
	c := f.proxyClient()
	tests := []struct {
		name       string
		url        string
		hdr        []string
		wantStatus int
		wantBody   string
	}{
		{"absolute-form allowed", "http://allowed.test/", nil, 200, "server=a"},
		{"absolute-form other", "http://other.test/", nil, 403, "corral: egress to other.test is not allowed"},
		{"absolute-form secret", "http://api.example.test/", nil, 200, "auth=Bearer secret"},
		{"CONNECT allowed", "https://allowed.test/", nil, 200, "sni=allowed.test"},
		{"CONNECT other", "https://other.test/", nil, 0, "Forbidden"},
		{"CONNECT port not allowed", "https://allowed.test:8443/", nil, 0, "Forbidden"},
		{"CONNECT loopback", "https://127.0.0.1:22/", nil, 0, "Forbidden"},
		{"CONNECT rebinding", "https://rebind.test/", nil, 0, "Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := get(t, c, tt.url, tt.hdr...)
			if status != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s via proxy = %d %q, want %d containing %q", tt.url, status, body, tt.wantStatus, tt.wantBody)
			}
		})
	}
	t.Run("CONNECT to allowed name, SNI other", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.addrs.HTTPProxy.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		tc := tls.Client(conn, &tls.Config{ServerName: "other.test", RootCAs: f.certs.Pool})
		if err := tc.HandshakeContext(t.Context()); err == nil {
			t.Error("TLS with SNI other.test through a CONNECT to allowed.test succeeded")
		}
	})
	// RFC 9112 §3.2.2: a proxy ignores the Host header of an absolute-form
	// request; the URI's authority is what gets checked and dialed.
	t.Run("absolute-form Host header ignored", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.addrs.HTTPProxy.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != 403 {
			t.Errorf("absolute-form other.test with Host allowed.test: %v %v, want 403", resp, err)
		}
	})
	t.Run("https URL without CONNECT", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.addrs.HTTPProxy.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != 400 {
			t.Errorf("GET https:// via proxy: %v %v, want 400", resp, err)
		}
	})
}

func TestLiveUpdate(t *testing.T) {
	f := newFixture(t, basePolicy())
	c := f.transparentClient()
	if status, _ := get(t, c, "http://other.test/"); status != 403 {
		t.Fatalf("before update: status %d", status)
	}
	p := basePolicy()
	p.Domains = append(p.Domains, DomainRule{Name: "other.test"})
	if err := f.srv.SetPolicy("sb1", p); err != nil {
		t.Fatal(err)
	}
	if status, body := get(t, c, "http://other.test/"); status != 200 || nettest.Field(body, "server") != "b" {
		t.Errorf("after update: %d %q", status, body)
	}
	if err := f.srv.SetPolicy("sb1", basePolicy()); err != nil {
		t.Fatal(err)
	}
	if status, _ := get(t, c, "http://other.test/"); status != 403 {
		t.Errorf("after revert: status %d", status)
	}
	if err := f.srv.SetPolicy("nope", basePolicy()); err == nil {
		t.Error("SetPolicy of an unknown sandbox succeeded")
	}
}

// Detach closes open tunnels and leaves no goroutine behind (goleak checks
// the rest at the end of the package).
func TestDetachClosesTunnels(t *testing.T) {
	f := newFixture(t, basePolicy())
	tc, err := tlsDial(t, f, "allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	done := make(chan error, 1)
	go func() {
		_, err := br.ReadByte()
		done <- err
	}()
	if err := f.srv.Detach("sb1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("read on a detached tunnel returned data")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("tunnel still open after Detach")
	}
	if _, err := net.DialTimeout("tcp", f.addrs.Transparent.String(), time.Second); err == nil {
		t.Error("transparent listener still accepts after Detach")
	}
	if err := f.srv.Detach("sb1"); err != nil {
		t.Errorf("second Detach: %v", err)
	}
}

func TestAttachConflicts(t *testing.T) {
	f := newFixture(t, basePolicy())
	if _, err := f.srv.Attach(t.Context(), "sb1", netip.MustParseAddr("127.0.0.1"), basePolicy()); err == nil {
		t.Error("second Attach of sb1 succeeded")
	}
	if _, err := f.srv.Attach(t.Context(), "sb2", netip.MustParseAddr("127.0.0.1"), Policy{Mode: "bogus"}); err == nil {
		t.Error("Attach with an invalid policy succeeded")
	}
	// Binding a port already taken fails cleanly and frees the id.
	srv2, err := New(Config{Upstreams: []netip.AddrPort{f.up.Addr}, Ports: Ports{Transparent: f.addrs.Transparent.Port()}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if _, err := srv2.Attach(t.Context(), "sb3", netip.MustParseAddr("127.0.0.1"), basePolicy()); err == nil {
		t.Error("Attach on a taken port succeeded")
	}
	if _, err := srv2.Attach(t.Context(), "sb3", netip.MustParseAddr("127.0.0.2"), basePolicy()); err != nil {
		t.Errorf("Attach after a failed Attach: %v", err)
	}
}
