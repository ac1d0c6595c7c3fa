package egress

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
)

// BenchmarkHTTPSRoundTrip compares a GET through the transparent proxy to
// a name that is spliced (allowed.test) with one to a name that is
// intercepted for a header rule (api.example.test), with a new sandbox
// connection per request and with a kept-alive one.
func BenchmarkHTTPSRoundTrip(b *testing.B) {
	f := newInterceptFixture(b, interceptPolicy())
	for _, keepAlive := range []bool{false, true} {
		for _, target := range []struct{ name, url string }{
			{"spliced", "https://allowed.test/"},
			{"intercepted", "https://api.example.test/"},
		} {
			name := target.name + "/new-conn"
			if keepAlive {
				name = target.name + "/keep-alive"
			}
			b.Run(name, func(b *testing.B) {
				tr := &http.Transport{
					DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
						var d net.Dialer
						return d.DialContext(ctx, "tcp", f.addrs.Transparent.String())
					},
					TLSClientConfig:   &tls.Config{RootCAs: f.pool},
					ForceAttemptHTTP2: true,
					DisableKeepAlives: !keepAlive,
				}
				defer tr.CloseIdleConnections()
				for b.Loop() {
					req, _ := http.NewRequestWithContext(b.Context(), "GET", target.url, nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		}
	}
}
