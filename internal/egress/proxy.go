package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// sniffTimeout bounds how long a new connection may take to send its
	// TLS ClientHello or HTTP request line.
	sniffTimeout = 10 * time.Second
	// dialTimeout bounds one connection attempt to one upstream address.
	dialTimeout = 10 * time.Second
)

type (
	routeKey struct{}
	connKey  struct{}
)

// transparentConn is a plaintext HTTP connection the transparent proxy
// sniffed. It carries the destination the sandbox addressed: its port is
// what a Host header without a port means; the address is only logged.
type transparentConn struct {
	prefixConn
	orig netip.AddrPort
	port uint16
}

// refusal is a policy decision against a destination. Its message is what
// the sandbox sees.
type refusal struct {
	host   string
	reason string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("corral: egress to %s is not allowed by this sandbox's network policy%s", r.host, r.reason)
}

// acceptTransparent serves the listener nftables redirects the sandbox's
// TCP 80 and 443 to.
func (sb *sandbox) acceptTransparent() {
	for {
		c, err := sb.transparent.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures (EMFILE): back off instead of spinning.
			select {
			case <-sb.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if !sb.active.enter() {
			c.Close()
			continue
		}
		if !sb.active.hold(c) {
			sb.active.exit()
			continue
		}
		go func() {
			defer sb.active.exit()
			defer sb.active.release(c)
			sb.handleTransparent(c)
		}()
	}
}

// handleTransparent decides one redirected connection. It reads the first
// byte: a TLS handshake record (0x16) is judged by the ClientHello's SNI;
// anything else goes to the HTTP server, which judges each request by its
// Host header. Without a name the connection is judged by the address the
// sandbox dialed, and only a CIDR rule or open mode allows that.
//
// The original destination comes from SO_ORIGINAL_DST and serves only to
// learn the port (80 or 443, or another port a CIDR rule redirected) and
// for logs; the proxy dials the name, never that address, so a sandbox
// cannot pair an allowed SNI with an address of its choosing.
func (sb *sandbox) handleTransparent(c net.Conn) {
	tc, _ := rawConn(c).(*net.TCPConn)
	var orig netip.AddrPort
	if tc != nil {
		if o, ok := originalDst(tc); ok && o != sb.addrs.Transparent {
			orig = o
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		c.Close()
		return
	}
	if first[0] != 0x16 {
		port := orig.Port()
		if port == 0 {
			port = 80
		}
		_ = c.SetReadDeadline(time.Time{})
		sb.httpQueue.put(&transparentConn{prefixConn: prefixConn{Conn: c, prefix: first[:]}, orig: orig, port: port})
		return
	}
	ctx, cancel := context.WithTimeout(sb.ctx, sniffTimeout)
	sni, hello, ok := readClientHello(ctx, &prefixConn{Conn: c, prefix: first[:]})
	cancel()
	if !ok {
		sb.decision("tls", "", orig, false, "not a TLS ClientHello")
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	port := orig.Port()
	if port == 0 {
		port = 443
	}
	p := sb.policy.Load()
	host := sni
	if host == "" {
		// No SNI (clients send none for IP-literal URLs): the address the
		// sandbox dialed is all there is, and it must be allowed as such.
		if !orig.IsValid() {
			sb.decision("tls", "", orig, false, "no SNI and no original destination")
			refuseTLS(c)
			return
		}
		host = orig.Addr().String()
	}
	if err := sb.check(host, port, p); err != nil {
		sb.decision("sni", host, orig, false, err.reason)
		refuseTLS(c)
		return
	}
	if sb.interceptable(sni, p) {
		sb.decision("sni", host, orig, true, "", "intercepted", true)
		sb.intercept(c, hello, sni, port, "sni", orig)
		return
	}
	up, err := sb.dial(sb.ctx, host, port, p)
	if err != nil {
		sb.decision("sni", host, orig, false, err.Error())
		refuseTLS(c)
		return
	}
	sb.decision("sni", host, orig, true, "")
	sb.pipe(c, up, hello)
}

func refuseTLS(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, tlsAccessDenied)
	c.Close()
}

// pipe writes what was already read from the client to up, then splices
// the two until both sides are done or the sandbox is detached.
func (sb *sandbox) pipe(client, up net.Conn, pending []byte) {
	if !sb.active.hold(up) {
		client.Close()
		return
	}
	defer sb.active.release(up)
	if len(pending) > 0 {
		if _, err := up.Write(pending); err != nil {
			client.Close()
			up.Close()
			return
		}
	}
	splice(client, up)
}

// check applies the policy to a destination named by the sandbox: a DNS
// name must be allowed on the port; an IP literal must be allowed as an
// address. It returns nil when allowed.
func (sb *sandbox) check(host string, port uint16, p *Policy) *refusal {
	if ip, err := netip.ParseAddr(host); err == nil {
		if !p.AllowsAddr(ip, port) || sb.srv.isLocal(ip) && !p.NamesAddr(ip, port) {
			return &refusal{host: host, reason: ""}
		}
		return nil
	}
	if !p.AllowsHost(host, port) {
		if p.AllowsName(host) {
			return &refusal{host: fmt.Sprintf("%s port %d", host, port)}
		}
		return &refusal{host: host}
	}
	return nil
}

// dial connects to host:port for a sandbox under policy p. A name is
// resolved by the upstreams and only its addresses that are neither
// blocked nor the host's own (unless an explicit CIDR rule names them) are
// tried: an allowed name that resolves to 127.0.0.1 or 169.254.169.254 is
// refused (DNS rebinding). An IP literal is dialed only if check allowed
// it. dial returns a *refusal for policy reasons.
func (sb *sandbox) dial(ctx context.Context, host string, port uint16, p *Policy) (net.Conn, error) {
	if r := sb.check(host, port, p); r != nil {
		return nil, r
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip.Unmap()}
	} else {
		name, _ := canonicalName(host)
		found, _, rcode, err := sb.srv.res.lookupA(ctx, name)
		if err != nil {
			return nil, err
		}
		if rcode != 0 || len(found) == 0 {
			return nil, fmt.Errorf("corral: %s has no IPv4 address", name)
		}
		for _, ip := range found {
			if sb.srv.addrOK(p, ip, port) {
				addrs = append(addrs, ip)
			}
		}
		if len(addrs) == 0 {
			return nil, &refusal{host: name, reason: ": it resolves only to blocked addresses"}
		}
	}
	var errs []error
	for _, ip := range addrs {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		c, err := sb.srv.cfg.Dial(dctx, netip.AddrPortFrom(ip, port))
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("corral: cannot reach %s: %w", host, errors.Join(errs...))
}

// addrOK reports whether ip may be used for a name the policy allowed: not
// blocked and not the host's own, unless an explicit rule names it.
func (s *Server) addrOK(p *Policy, ip netip.Addr, port uint16) bool {
	if p.NamesAddr(ip, port) {
		return true
	}
	return !IsBlocked(ip) && !s.isLocal(ip)
}

// isLocal reports whether ip is one of the host's own addresses, by asking
// the kernel for its route (type RTN_LOCAL). Errors count as local: the
// check fails closed.
func (s *Server) isLocal(ip netip.Addr) bool {
	routes, err := s.routes.RouteGet(ip.AsSlice())
	if err != nil || len(routes) == 0 {
		return true
	}
	return routes[0].Type == unix.RTN_LOCAL
}

// serveHTTP handles every request on the explicit proxy port and every
// plaintext request the transparent proxy sniffed. The authority is
// r.Host: for absolute-form requests Go's server has already replaced the
// Host header with the URI's authority, as RFC 9112 §3.2.2 requires of
// proxies. Each request on a keep-alive connection is judged on its own,
// so a second request cannot switch to another host.
func (sb *sandbox) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !sb.active.enter() {
		http.Error(w, "corral: sandbox egress is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer sb.active.exit()
	p := sb.policy.Load()
	defPort := uint16(80)
	via := "http_proxy"
	var orig netip.AddrPort
	if tc, ok := r.Context().Value(connKey{}).(*transparentConn); ok {
		defPort, via, orig = tc.port, "host", tc.orig
	}
	if r.Method == http.MethodConnect {
		sb.serveConnect(w, r, p)
		return
	}
	if r.URL.Scheme != "" && r.URL.Scheme != "http" {
		http.Error(w, "corral: the proxy forwards only http:// URLs; use CONNECT for https", http.StatusBadRequest)
		return
	}
	host, port, err := splitHostPort(r.Host, defPort)
	if err != nil || host == "" {
		sb.decision(via, r.Host, orig, false, "no usable Host header")
		http.Error(w, "corral: request has no usable Host header", http.StatusBadRequest)
		return
	}
	if ref := sb.check(host, port, p); ref != nil {
		sb.decision(via, host, orig, false, ref.reason)
		http.Error(w, ref.Error(), http.StatusForbidden)
		return
	}
	sb.decision(via, host, orig, true, "")
	sb.forward(w, r, p, "http", host, port)
}

// route is what the proxy decided for one request: where it goes, under
// which policy, and what it injects.
type route struct {
	policy    *Policy
	scheme    string
	authority string
	inject    *injection
}

// forward sends an allowed request to host:port with the policy's
// headers and placeholders applied. Secrets are resolved here, once per
// request; a secret that cannot be resolved fails the request with 502.
func (sb *sandbox) forward(w http.ResponseWriter, r *http.Request, p *Policy, scheme, host string, port uint16) {
	inj, err := sb.injectionFor(r.Context(), p, host)
	if err != nil {
		var se *secretError
		if errors.As(err, &se) {
			sb.srv.log.Warn("egress secret unavailable", "sandbox_id", sb.id, "host", host, "secret", se.name, "err", se.err)
		}
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for _, env := range inj.strays(r) {
		sb.srv.log.Warn("egress placeholder sent to a host it is not for; left as is", "sandbox_id", sb.id, "host", host, "env", env)
	}
	ctx := context.WithValue(r.Context(), routeKey{}, &route{policy: p, scheme: scheme, authority: netJoin(host, port), inject: inj})
	sb.proxy.ServeHTTP(w, r.WithContext(ctx))
}

func netJoin(host string, port uint16) string {
	return net.JoinHostPort(host, fmt.Sprint(port))
}

// rewrite prepares the outbound request: same method, path, Host and
// body, to the authority that was checked, with the policy's headers and
// placeholders applied. ReverseProxy has already removed hop-by-hop
// headers (Proxy-Authorization among them) and adds no X-Forwarded-For.
func (sb *sandbox) rewrite(pr *httputil.ProxyRequest) {
	rt, _ := pr.In.Context().Value(routeKey{}).(*route)
	if rt == nil {
		return // forward always sets it
	}
	pr.Out.URL.Scheme = rt.scheme
	pr.Out.URL.Host = rt.authority
	pr.Out.Host = pr.In.Host
	rt.inject.apply(pr.Out)
}

func (sb *sandbox) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var ref *refusal
	switch {
	case errors.As(err, &ref):
		sb.decision("dial", ref.host, netip.AddrPort{}, false, ref.reason)
		http.Error(w, ref.Error(), http.StatusForbidden)
	case certError(err):
		// Never fall back to passing the connection through: the
		// sandbox trusts the proxy's certificate for this name.
		host := r.Host
		if rt, ok := r.Context().Value(routeKey{}).(*route); ok {
			host, _, _ = splitHostPort(rt.authority, 0)
		}
		sb.srv.log.Warn("egress upstream certificate rejected", "sandbox_id", sb.id, "host", host, "err", err)
		http.Error(w, fmt.Sprintf("corral: %s presented a certificate that is not valid, so the request was not sent: %v", host, err), http.StatusBadGateway)
	case r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
	default:
		http.Error(w, fmt.Sprintf("corral: %s: %v", r.Host, err), http.StatusBadGateway)
	}
}

// serveConnect opens a tunnel for "CONNECT host:port" (RFC 9110 §9.3.6):
// the target is checked and dialed first, so refusals are ordinary 403
// responses. If the tunnel then carries TLS, its SNI must be allowed too,
// so an allowed CONNECT target cannot front for another name.
func (sb *sandbox) serveConnect(w http.ResponseWriter, r *http.Request, p *Policy) {
	host, port, err := splitHostPort(r.Host, 0)
	if err != nil || port == 0 || host == "" {
		http.Error(w, "corral: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	if ref := sb.check(host, port, p); ref != nil {
		sb.decision("connect", host, netip.AddrPort{}, false, ref.reason)
		http.Error(w, ref.Error(), http.StatusForbidden)
		return
	}
	// A target some rule needs to see is dialed only if the tunnel turns
	// out not to be intercepted; the proxy dials per request otherwise.
	var up net.Conn
	closeUp := func() {
		if up != nil {
			up.Close()
		}
	}
	if !sb.interceptable(host, p) {
		up, err = sb.dial(r.Context(), host, port, p)
		if err != nil {
			var ref *refusal
			if errors.As(err, &ref) {
				sb.decision("connect", host, netip.AddrPort{}, false, ref.reason)
				http.Error(w, ref.Error(), http.StatusForbidden)
				return
			}
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		closeUp()
		http.Error(w, "corral: cannot hijack connection", http.StatusInternalServerError)
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		closeUp()
		return
	}
	if !sb.active.hold(client) {
		closeUp()
		return
	}
	defer sb.active.release(client)
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		client.Close()
		closeUp()
		return
	}
	// Bytes the client sent after the CONNECT head may sit in brw.
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending, _ = brw.Reader.Peek(n)
		pending = append([]byte(nil), pending...)
	}
	in := &prefixConn{Conn: client, prefix: pending}
	_ = client.SetReadDeadline(time.Now().Add(sniffTimeout))
	var first [1]byte
	if _, err := io.ReadFull(in, first[:]); err != nil {
		client.Close()
		closeUp()
		return
	}
	head := []byte{first[0]}
	if first[0] == 0x16 {
		ctx, cancel := context.WithTimeout(sb.ctx, sniffTimeout)
		sni, hello, ok := readClientHello(ctx, &prefixConn{Conn: in, prefix: head})
		cancel()
		if !ok || sni != "" && !strings.EqualFold(sni, host) && sb.check(sni, port, p) != nil {
			sb.decision("connect_sni", sni, netip.AddrPort{}, false, "SNI differs from the CONNECT target and is not allowed")
			refuseTLS(client)
			closeUp()
			return
		}
		if sb.interceptable(sni, p) {
			_ = client.SetReadDeadline(time.Time{})
			closeUp()
			sb.decision("connect", sni, netip.AddrPort{}, true, "", "intercepted", true)
			sb.intercept(in, hello, sni, port, "connect", netip.AddrPort{})
			return
		}
		head = hello
	} else if len(in.prefix) > 0 {
		head = append(head, in.prefix...)
		in.prefix = nil
	}
	if up == nil {
		up, err = sb.dial(r.Context(), host, port, p)
		if err != nil {
			reason := err.Error()
			var ref *refusal
			if errors.As(err, &ref) {
				reason = ref.reason
			}
			sb.decision("connect", host, netip.AddrPort{}, false, reason)
			client.Close()
			return
		}
	}
	_ = client.SetReadDeadline(time.Time{})
	sb.decision("connect", host, netip.AddrPort{}, true, "")
	sb.pipe(client, up, head)
}

// decision logs one policy decision.
func (sb *sandbox) decision(via, host string, orig netip.AddrPort, allowed bool, reason string, extra ...any) {
	attrs := append([]any{"sandbox_id", sb.id, "via", via, "host", host, "allowed", allowed}, extra...)
	if orig.Addr().IsValid() {
		attrs = append(attrs, "dst", orig.String())
	}
	if reason != "" {
		attrs = append(attrs, "reason", strings.TrimPrefix(reason, ": "))
	}
	sb.srv.log.Info("egress decision", attrs...)
}
