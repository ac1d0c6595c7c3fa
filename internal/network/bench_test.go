package network

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/egress"
)

// BenchmarkSetupTeardown measures one sandbox network's setup and
// teardown, reported separately as ms/setup and ms/teardown (the time
// Teardown takes to return). With a veth, "+wait" also waits for the
// background part (chains and veth, reap.go) after each teardown: the
// full cost of one sandbox alone. "+spare" sets up from a spare network
// (spare.go), made untimed before each setup.
func BenchmarkSetupTeardown(b *testing.B) {
	for _, mode := range []egress.Mode{egress.ModeNone, egress.ModeAllowlist} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := testConfig(b)
			m := newTestManager(b, cfg)
			benchSetupTeardown(b, m, egress.Policy{Mode: mode}, false, nil)
		})
		b.Run(string(mode)+"+spare", func(b *testing.B) {
			cfg := testConfig(b)
			cfg.Spares, cfg.SpareDelay = 1, time.Hour
			m := newTestManager(b, cfg)
			benchSetupTeardown(b, m, egress.Policy{Mode: mode}, false, func() { makeSpares(b, m, mode != egress.ModeNone) })
		})
	}
	b.Run("allowlist+wait", func(b *testing.B) {
		cfg := testConfig(b)
		m := newTestManager(b, cfg)
		benchSetupTeardown(b, m, egress.Policy{Mode: egress.ModeAllowlist}, true, nil)
	})
	// With the egress server binding its four sockets per sandbox.
	b.Run("allowlist+egress", func(b *testing.B) {
		w := newWorld(b)
		benchSetupTeardown(b, w.m, allowlist("allowed.test"), false, nil)
	})
	b.Run("allowlist+egress+spare", func(b *testing.B) {
		w := newWorld(b)
		w.m.cfg.Spares, w.m.cfg.SpareDelay = 1, time.Hour
		benchSetupTeardown(b, w.m, allowlist("allowed.test"), false, func() { makeSpares(b, w.m, true) })
	})
}

// benchSetupTeardown sets up and tears down a network per iteration; if
// prepare is set, it runs untimed before each setup.
func benchSetupTeardown(b *testing.B, m *Manager, p egress.Policy, wait bool, prepare func()) {
	ctx := context.Background()
	var setup, teardown time.Duration
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("bench%d", i)
		i++
		if prepare != nil {
			prepare()
		}
		t0 := time.Now()
		if _, err := m.Setup(ctx, id, p); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		if wait {
			m.waitReaped()
		}
		setup += t1.Sub(t0)
		teardown += time.Since(t1)
	}
	m.waitReaped()
	b.ReportMetric(float64(setup.Microseconds())/1000/float64(i), "ms/setup")
	b.ReportMetric(float64(teardown.Microseconds())/1000/float64(i), "ms/teardown")
}

// BenchmarkTeardownMany tears down 100 allowlist networks in a row and
// waits until every chain and veth is gone: ms/teardown is that total per
// sandbox, background part included (batched, reap.go).
func BenchmarkTeardownMany(b *testing.B) {
	cfg := testConfig(b)
	m := newTestManager(b, cfg)
	ctx := context.Background()
	const n = 100
	var total time.Duration
	round := 0
	for b.Loop() {
		b.StopTimer()
		for i := range n {
			if _, err := m.Setup(ctx, fmt.Sprintf("many%d-%d", round, i), egress.Policy{Mode: egress.ModeAllowlist}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		for i := range n {
			if err := m.Teardown(ctx, fmt.Sprintf("many%d-%d", round, i)); err != nil {
				b.Fatal(err)
			}
		}
		m.waitReaped()
		total += time.Since(start)
		round++
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(round*n), "ms/teardown")
}

// benchSandbox is a sandbox that reaches server A by name through the
// proxy and server B directly, by a CIDR rule: the same kind of server over
// the same veths, so the difference is the proxy.
func benchSandbox(b *testing.B) (*world, *inside) {
	w := newWorld(b)
	s := w.sandbox(b, "bench", egress.Policy{Mode: egress.ModeAllowlist,
		Domains: []egress.DomainRule{{Name: "allowed.test"}, {Name: "other.test"}},
		CIDRs:   []egress.CIDRRule{{Prefix: netip.PrefixFrom(w.in.B, 32)}},
	})
	return w, s
}

// BenchmarkProxyThroughput downloads 32 MiB per iteration over plain HTTP
// (the proxy forwards requests) and HTTPS (the proxy splices), through
// the proxy and directly.
func BenchmarkProxyThroughput(b *testing.B) {
	const size = 32 << 20
	w, s := benchSandbox(b)
	c := s.client()
	for _, tc := range []struct{ name, url string }{
		{"http/direct", fmt.Sprintf("http://%s/bytes?n=%d", w.in.B, size)},
		{"http/proxy", fmt.Sprintf("http://allowed.test/bytes?n=%d", size)},
		{"https/direct", fmt.Sprintf("https://other.test/bytes?n=%d", size)}, // resolves to B, CIDR-allowed
		{"https/proxy", fmt.Sprintf("https://allowed.test/bytes?n=%d", size)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				resp, err := c.Get(tc.url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != size || resp.StatusCode != http.StatusOK {
					b.Fatalf("got %d bytes, status %d: %v", n, resp.StatusCode, err)
				}
			}
		})
	}
}

// BenchmarkProxyLatency measures a new connection plus one small request,
// through the proxy and directly. DNS is resolved once, outside the loop.
func BenchmarkProxyLatency(b *testing.B) {
	w, s := benchSandbox(b)
	a, err := s.lookup("allowed.test")
	if err != nil {
		b.Fatal(err)
	}
	c := s.client()
	for _, tc := range []struct{ name, url, host string }{
		{"http/direct", "http://" + w.in.B.String() + "/", ""},
		{"http/proxy", "http://" + a + "/", "allowed.test"},
		{"https/direct", "https://" + w.in.B.String() + "/", "other.test"},
		{"https/proxy", "https://" + a + "/", "allowed.test"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tr := c.Transport.(*http.Transport).Clone()
			tr.TLSClientConfig.ServerName = tc.host
			hc := &http.Client{Transport: tr}
			for b.Loop() {
				req, _ := http.NewRequest("GET", tc.url, nil)
				if tc.host != "" {
					req.Host = tc.host
				}
				resp, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
