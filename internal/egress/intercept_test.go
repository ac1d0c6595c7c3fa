package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/network/nettest"
)

const (
	apiPlaceholder  = "corral-placeholder-0123456789abcdef0123456789abcdef"
	wildPlaceholder = "corral-placeholder-fedcba9876543210fedcba9876543210"
)

// fakeSecrets is a SecretSource backed by a map; it records the sandbox
// ids it was asked for.
type fakeSecrets struct {
	mu     sync.Mutex
	values map[string]string
	asked  []string
}

func (s *fakeSecrets) Secret(_ context.Context, sandboxID, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, sandboxID)
	v, ok := s.values[name]
	if !ok {
		return "", fmt.Errorf("secret %s does not exist", name)
	}
	return v, nil
}

func (s *fakeSecrets) set(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values[name] = value
}

func interceptPolicy() Policy {
	return Policy{Mode: ModeAllowlist,
		Domains: []DomainRule{{Name: "allowed.test"}, {Name: "api.example.test"}, {Name: "*.wild.test"}, {Name: "mixed.test"}},
		Headers: []HeaderRule{
			{Domain: "api.example.test", Name: "Authorization", Value: "Bearer {{secret:api-token}}"},
			{Domain: "mixed.test", Name: "X-Mixed", Value: "1"},
		},
		Placeholders: []PlaceholderRule{
			{Domain: "api.example.test", Env: "API_KEY", Secret: "api-key", Placeholder: apiPlaceholder, Body: true},
			{Domain: "*.wild.test", Env: "WILD_KEY", Secret: "api-key", Placeholder: wildPlaceholder},
		},
	}
}

// interceptFixture is a fixture whose Server intercepts with a fresh CA
// and resolves secrets from a fakeSecrets.
type interceptFixture struct {
	*fixture
	ca      *CA
	secrets *fakeSecrets
	pool    *x509.CertPool // trusts the Corral CA and the test servers' CA
}

func newInterceptFixture(t testing.TB, p Policy, opts ...func(*Config)) *interceptFixture {
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	secrets := &fakeSecrets{values: map[string]string{"api-token": "tok1", "api-key": "key-value-1"}}
	opts = append([]func(*Config){func(c *Config) { c.CA, c.Secrets = ca, secrets }}, opts...)
	f := newFixture(t, p, opts...)
	pool := f.certs.Pool.Clone()
	pool.AppendCertsFromPEM(ca.CertPEM())
	return &interceptFixture{fixture: f, ca: ca, secrets: secrets, pool: pool}
}

// client returns an HTTPS client of the sandbox: through the transparent
// proxy or the explicit one (CONNECT), speaking HTTP/2 if h2.
func (f *interceptFixture) client(via string, h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: f.pool},
		ForceAttemptHTTP2: h2,
		DisableKeepAlives: true,
	}
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	switch via {
	case "transparent":
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", f.addrs.Transparent.String())
		}
	case "connect":
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: f.addrs.HTTPProxy.String()})
	}
	return &http.Client{Transport: tr}
}

type result struct {
	status int
	body   string
	proto  string
	issuer string
}

func do(t testing.TB, c *http.Client, method, url, body string, hdr ...string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
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
		return result{body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, body: string(b), proto: resp.Proto}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		r.issuer = resp.TLS.PeerCertificates[0].Issuer.CommonName
	}
	return r
}

func TestInterceptHeaders(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	for _, via := range []string{"transparent", "connect"} {
		for _, h2 := range []bool{true, false} {
			wantProto := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
			t.Run(via+" "+wantProto, func(t *testing.T) {
				r := do(t, f.client(via, h2), "GET", "https://api.example.test/", "", "Authorization", "Bearer from-sandbox")
				if r.status != 200 || !strings.Contains(r.body, "auth=Bearer tok1\n") {
					t.Fatalf("got %d %q, want 200 with the injected header", r.status, r.body)
				}
				if r.proto != wantProto || r.issuer != "Corral egress CA" {
					t.Errorf("proto %s, issuer %q; want %s from the Corral CA", r.proto, r.issuer, wantProto)
				}
				if s := f.lastSeen(t); !s.tls || s.server != "a" || s.header.Get("Authorization") != "Bearer tok1" || nettest.Field(r.body, "sni") != "api.example.test" {
					t.Errorf("upstream saw tls=%v server=%s auth=%q (%q)", s.tls, s.server, s.header.Get("Authorization"), r.body)
				}
			})
		}
	}
	logs := f.log.String()
	for _, want := range []string{
		"sandbox_id=sb1 via=sni host=api.example.test allowed=true intercepted=true",
		"sandbox_id=sb1 via=connect host=api.example.test allowed=true intercepted=true",
		"sandbox_id=sb1 via=https host=api.example.test allowed=true intercepted=true",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "tok1") {
		t.Error("a secret value appears in the logs")
	}
}

// Names without rules stay end to end: the sandbox sees the server's own
// certificate.
func TestInterceptOnlyRuleDomains(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	for _, via := range []string{"transparent", "connect"} {
		r := do(t, f.client(via, true), "GET", "https://allowed.test/", "")
		if r.status != 200 || r.issuer != "corral test CA" || nettest.Field(r.body, "sni") != "allowed.test" {
			t.Errorf("%s: got %d issuer %q %q; want the upstream's own certificate", via, r.status, r.issuer, r.body)
		}
	}
	if strings.Contains(f.log.String(), "host=allowed.test allowed=true intercepted") {
		t.Error("allowed.test was intercepted")
	}
	// Without a CA nothing is intercepted, rules or not.
	plain := newFixture(t, interceptPolicy())
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", plain.addrs.Transparent.String())
		},
		TLSClientConfig: &tls.Config{RootCAs: plain.certs.Pool},
	}}
	if r := do(t, c, "GET", "https://api.example.test/", ""); r.status != 200 || r.issuer != "corral test CA" || nettest.Field(r.body, "auth") != "" {
		t.Errorf("without a CA: got %d issuer %q %q", r.status, r.issuer, r.body)
	}
}

func TestInterceptUpstreamCertificate(t *testing.T) {
	t.Run("name not in the certificate", func(t *testing.T) {
		f := newInterceptFixture(t, interceptPolicy())
		r := do(t, f.client("transparent", true), "GET", "https://mixed.test/", "")
		if r.status != http.StatusBadGateway || !strings.Contains(r.body, "mixed.test presented a certificate that is not valid") {
			t.Errorf("got %d %q, want 502 naming the certificate", r.status, r.body)
		}
		if !strings.Contains(f.log.String(), "egress upstream certificate rejected") {
			t.Errorf("no log line for the rejected certificate:\n%s", f.log)
		}
	})
	t.Run("unknown authority", func(t *testing.T) {
		other := nettest.NewCerts(t, "api.example.test")
		f := newInterceptFixture(t, interceptPolicy(), func(c *Config) { c.UpstreamRoots = other.Pool })
		for _, via := range []string{"transparent", "connect"} {
			r := do(t, f.client(via, false), "GET", "https://api.example.test/", "")
			if r.status != http.StatusBadGateway || !strings.Contains(r.body, "not valid") || !strings.Contains(r.body, "unknown authority") {
				t.Errorf("%s: got %d %q, want 502 naming the unknown authority", via, r.status, r.body)
			}
		}
		if n := len(f.Seen()); n != 0 {
			t.Errorf("%d requests reached the untrusted server", n)
		}
	})
}

// Inside an intercepted connection every request must be for the SNI.
func TestInterceptHostMustMatchSNI(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	for _, h2 := range []bool{true, false} {
		for _, host := range []string{"allowed.test", "other.test", "api.example.test:8443"} {
			r := do(t, f.client("transparent", h2), "GET", "https://api.example.test/", "", "Host", host)
			if r.status != http.StatusMisdirectedRequest || !strings.Contains(r.body, "this connection is for api.example.test") {
				t.Errorf("h2=%v Host %s: got %d %q, want 421", h2, host, r.status, r.body)
			}
		}
	}
	if r := do(t, f.client("transparent", false), "GET", "https://api.example.test/", "", "Host", "API.example.test."); r.status != 200 {
		t.Errorf("Host in another case with a trailing dot: %d %q", r.status, r.body)
	}
	for _, s := range f.Seen() {
		if s.header.Get("Authorization") != "Bearer tok1" {
			t.Errorf("a request for another host reached a server: %+v", s)
		}
	}
}

func TestInterceptWebSocket(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	raw, err := net.Dial("tcp", f.addrs.Transparent.String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	c := tls.Client(raw, &tls.Config{ServerName: "api.example.test", RootCAs: f.pool, NextProtos: []string{"http/1.1"}})
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: api.example.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: mine\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Seen-Authorization") != "Bearer tok1" ||
		resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("upgrade: %d %v", resp.StatusCode, resp.Header)
	}
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping" {
		t.Errorf("echo after upgrade: %q %v", got, err)
	}
}

func TestPlaceholders(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	h2 := f.client("transparent", true)
	// A body of several read chunks with placeholders at the edges and
	// across a chunk boundary.
	filler := strings.Repeat("x", replaceChunk-20)
	body := apiPlaceholder + filler + apiPlaceholder + filler + "=" + apiPlaceholder
	want := strings.ReplaceAll(body, apiPlaceholder, "key-value-1")

	t.Run("header, rule domain", func(t *testing.T) {
		r := do(t, h2, "GET", "https://api.example.test/", "", "X-Api-Key", "k="+apiPlaceholder)
		if got := f.lastSeen(t).header.Get("X-Api-Key"); r.status != 200 || got != "k=key-value-1" {
			t.Errorf("got %d, upstream saw X-Api-Key %q", r.status, got)
		}
	})
	t.Run("body with Body set", func(t *testing.T) {
		r := do(t, h2, "POST", "https://api.example.test/body", body)
		if r.status != 200 || r.body != want {
			t.Errorf("got %d, %d bytes, want %d bytes with the secret", r.status, len(r.body), len(want))
		}
	})
	t.Run("body without Body", func(t *testing.T) {
		r := do(t, f.client("transparent", false), "POST", "https://a.wild.test/body", wildPlaceholder, "X-Key", wildPlaceholder)
		if s := f.lastSeen(t); r.status != 200 || r.body != wildPlaceholder || s.header.Get("X-Key") != "key-value-1" {
			t.Errorf("got %d %q, header %q; want the body as sent and the header replaced", r.status, r.body, s.header.Get("X-Key"))
		}
	})
	t.Run("plaintext rule domain", func(t *testing.T) {
		r := do(t, f.transparentClient(), "POST", "http://api.example.test/body", body, "X-Api-Key", apiPlaceholder)
		if s := f.lastSeen(t); r.status != 200 || r.body != want || s.header.Get("X-Api-Key") != "key-value-1" || s.tls {
			t.Errorf("got %d, %d bytes, header %q", r.status, len(r.body), s.header.Get("X-Api-Key"))
		}
	})
	t.Run("other host, plaintext", func(t *testing.T) {
		r := do(t, f.transparentClient(), "POST", "http://allowed.test/body", apiPlaceholder, "X-Api-Key", apiPlaceholder)
		if s := f.lastSeen(t); r.status != 200 || r.body != apiPlaceholder || s.header.Get("X-Api-Key") != apiPlaceholder {
			t.Errorf("got %d %q, header %q; want both as sent", r.status, r.body, s.header.Get("X-Api-Key"))
		}
	})
	t.Run("other host, intercepted", func(t *testing.T) {
		r := do(t, h2, "GET", "https://a.wild.test/", "", "X-Api-Key", apiPlaceholder)
		if s := f.lastSeen(t); r.status != 200 || s.header.Get("X-Api-Key") != apiPlaceholder {
			t.Errorf("got %d, header %q; want it as sent", r.status, s.header.Get("X-Api-Key"))
		}
	})
	logs := f.log.String()
	for _, host := range []string{"allowed.test", "a.wild.test"} {
		if want := "level=WARN msg=\"egress placeholder sent to a host it is not for; left as is\" sandbox_id=sb1 host=" + host + " env=API_KEY"; !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "key-value-1") {
		t.Error("a secret value appears in the logs")
	}
}

func TestSecretRotationAndFailures(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	c := f.client("transparent", true)
	auth := func() result { return do(t, c, "GET", "https://api.example.test/", "") }
	if r := auth(); !strings.Contains(r.body, "auth=Bearer tok1\n") {
		t.Fatalf("first: %d %q", r.status, r.body)
	}
	f.secrets.set("api-token", "tok2")
	if r := auth(); !strings.Contains(r.body, "auth=Bearer tok2\n") {
		t.Errorf("after rotation: %d %q", r.status, r.body)
	}
	f.secrets.mu.Lock()
	delete(f.secrets.values, "api-token")
	asked := append([]string(nil), f.secrets.asked...)
	f.secrets.mu.Unlock()
	for _, id := range asked {
		if id != "sb1" {
			t.Errorf("secret asked for sandbox %q", id)
		}
	}
	r := auth()
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, `secret "api-token"`) || strings.Contains(r.body, "tok2") {
		t.Errorf("missing secret: %d %q, want 502 naming it", r.status, r.body)
	}
	if !strings.Contains(f.log.String(), "egress secret unavailable") {
		t.Errorf("no log line for the missing secret:\n%s", f.log)
	}
	// Plaintext requests need their secrets too.
	if r := do(t, f.transparentClient(), "GET", "http://api.example.test/", ""); r.status != http.StatusBadGateway {
		t.Errorf("plaintext, missing secret: %d %q", r.status, r.body)
	}

	nostore := newInterceptFixture(t, interceptPolicy(), func(c *Config) { c.Secrets = nil })
	if r := do(t, nostore.client("connect", false), "GET", "https://api.example.test/", ""); r.status != http.StatusBadGateway || !strings.Contains(r.body, "no secret store") {
		t.Errorf("no secret store: %d %q", r.status, r.body)
	}
	if r := do(t, nostore.client("connect", false), "GET", "https://mixed.test/", ""); r.status != http.StatusBadGateway || strings.Contains(r.body, "secret") {
		t.Errorf("a rule without secrets needs no store: %d %q", r.status, r.body)
	}
}

// Detach closes intercepted connections, including HTTP/2 ones, and
// leaves no goroutine behind (goleak checks at the end of the package).
func TestInterceptDetach(t *testing.T) {
	f := newInterceptFixture(t, interceptPolicy())
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", f.addrs.Transparent.String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: f.pool},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	if r := do(t, c, "GET", "https://api.example.test/", ""); r.status != 200 || r.proto != "HTTP/2.0" {
		t.Fatalf("got %d %s", r.status, r.proto)
	}
	if err := f.srv.Detach("sb1"); err != nil {
		t.Fatal(err)
	}
	if r := do(t, c, "GET", "https://api.example.test/", ""); r.status == 200 {
		t.Error("request on a detached sandbox's kept-alive connection succeeded")
	}
}
