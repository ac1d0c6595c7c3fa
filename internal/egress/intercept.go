package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// interceptConn is a sandbox connection whose TLS the proxy terminates
// because a header or placeholder rule applies to its server name. Every
// request on it must be for host:port.
type interceptConn struct {
	net.Conn
	host string // canonical SNI
	port uint16
	via  string
	orig netip.AddrPort
}

type interceptKey struct{}

// interceptable reports whether the proxy terminates TLS for sni under
// policy p: only names some rule needs to see, and only with a CA.
func (sb *sandbox) interceptable(sni string, p *Policy) bool {
	return sni != "" && sb.srv.cfg.CA != nil && p.intercepts(sni)
}

// intercept hands a sandbox connection, whose ClientHello (hello) was
// already read and whose destination was already allowed, to the
// intercepting HTTP server, which completes the handshake with a leaf
// certificate for sni and serves HTTP/2 or HTTP/1.1, as the client's ALPN
// chooses.
func (sb *sandbox) intercept(c net.Conn, hello []byte, sni string, port uint16, via string, orig netip.AddrPort) {
	name, _ := canonicalName(sni)
	ic := &interceptConn{Conn: &prefixConn{Conn: c, prefix: hello}, host: name, port: port, via: via, orig: orig}
	sb.tlsQueue.put(tls.Server(ic, sb.tlsConfig))
}

func (sb *sandbox) startIntercept(addr net.Addr) {
	ca := sb.srv.cfg.CA
	sb.tlsConfig = &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name, ok := canonicalName(hi.ServerName)
			if !ok {
				return nil, fmt.Errorf("no usable server name %q", hi.ServerName)
			}
			return ca.leaf(name)
		},
	}
	sb.tlsQueue = newConnQueue(addr)
	sb.tlsSrv = &http.Server{
		Handler:           http.HandlerFunc(sb.serveIntercepted),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return sb.ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				if ic, ok := tc.NetConn().(*interceptConn); ok {
					return context.WithValue(ctx, interceptKey{}, ic)
				}
			}
			return ctx
		},
		ErrorLog: log.New(discard{}, "", 0),
	}
	sb.serving.Go(func() { _ = sb.tlsSrv.Serve(sb.tlsQueue) })
}

// serveIntercepted handles every request inside an intercepted TLS
// connection. The connection was allowed for its SNI; each request must
// name the same host (Host, or :authority in HTTP/2) or it is refused
// with 421 Misdirected Request (RFC 9110 §15.5.20: "the request was
// directed at a server that is unable or unwilling to produce an
// authoritative response for the target URI"), so a sandbox cannot reuse
// the connection for a name the policy judged separately.
func (sb *sandbox) serveIntercepted(w http.ResponseWriter, r *http.Request) {
	if !sb.active.enter() {
		http.Error(w, "corral: sandbox egress is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer sb.active.exit()
	ic, _ := r.Context().Value(interceptKey{}).(*interceptConn)
	if ic == nil {
		http.Error(w, "corral: no intercepted connection", http.StatusInternalServerError)
		return
	}
	if r.Method == http.MethodConnect {
		sb.decision("https", ic.host, ic.orig, false, "CONNECT inside an intercepted connection", "intercepted", true)
		http.Error(w, "corral: CONNECT is not supported inside this connection", http.StatusMethodNotAllowed)
		return
	}
	host, port, err := splitHostPort(r.Host, ic.port)
	if name, ok := canonicalName(host); err != nil || !ok || name != ic.host || port != ic.port {
		sb.decision("https", r.Host, ic.orig, false, "host differs from the TLS server name "+ic.host, "intercepted", true)
		http.Error(w, fmt.Sprintf("corral: this connection is for %s; open a new one for %s", ic.host, r.Host), http.StatusMisdirectedRequest)
		return
	}
	p := sb.policy.Load()
	if ref := sb.check(ic.host, ic.port, p); ref != nil {
		sb.decision("https", ic.host, ic.orig, false, ref.reason, "intercepted", true)
		http.Error(w, ref.Error(), http.StatusForbidden)
		return
	}
	sb.decision("https", ic.host, ic.orig, true, "", "intercepted", true)
	sb.forward(w, r, p, "https", ic.host, ic.port)
}

// certError reports whether err is the upstream's certificate failing
// verification.
func certError(err error) bool {
	var cve *tls.CertificateVerificationError
	return errors.As(err, &cve)
}
