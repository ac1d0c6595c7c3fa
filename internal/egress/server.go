package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// Ports are where a sandbox's DNS resolver and proxies listen on its host
// address. nftables sends the sandbox's port-53 traffic to DNS and its TCP
// 80/443 to Transparent; HTTPProxy is for tools configured with
// HTTP_PROXY/HTTPS_PROXY. A zero port binds an ephemeral one (tests only:
// nftables needs fixed ports).
type Ports struct {
	DNS         uint16 `json:"dns"`
	Transparent uint16 `json:"transparent"`
	HTTPProxy   uint16 `json:"http_proxy"`
}

// DefaultServerPorts are the ports the daemon uses.
func DefaultServerPorts() Ports { return Ports{DNS: 53, Transparent: 15001, HTTPProxy: 15002} }

// Limits bound what one sandbox can make the host do. Zero fields take the
// defaults noted.
type Limits struct {
	// MaxNameLength is the longest query name answered, in characters
	// without the trailing dot (default 128). DNS allows 253.
	MaxNameLength int
	// MaxLabelLength is the longest label of a query name (default 48).
	// DNS allows 63; tunnels fill labels with encoded payload.
	MaxLabelLength int
	// MaxQueries is how many DNS queries may wait on upstreams at once
	// (default 64); more are answered SERVFAIL at once.
	MaxQueries int
	// MaxConns is how many proxy connections may be open at once
	// (default 256); more wait in the listen backlog.
	MaxConns int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxNameLength, 128)
	def(&l.MaxLabelLength, 48)
	def(&l.MaxQueries, 64)
	def(&l.MaxConns, 256)
	return l
}

// Config configures a Server.
type Config struct {
	// Upstreams are the DNS resolvers asked about allowed names, by the
	// sandboxes' resolver and by the proxy. Required.
	Upstreams []netip.AddrPort
	// Ports to listen on, on each sandbox's host address.
	Ports Ports
	// Limits per sandbox.
	Limits Limits
	// Logger receives one line per decision (sandbox_id, host, allowed).
	Logger *slog.Logger
	// Dial connects the proxy to an address that passed every check. Nil
	// means a plain TCP dial. Tests set it to keep traffic inside the
	// namespaces they built.
	Dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// CA signs the certificates the proxy presents when it terminates a
	// sandbox's TLS to a name a header or placeholder rule applies to.
	// Nil never terminates TLS: those rules then act on plaintext HTTP
	// only.
	CA *CA
	// UpstreamRoots verify the servers the proxy connects to on behalf of
	// intercepted connections; nil means the host's system roots.
	UpstreamRoots *x509.CertPool
	// Secrets resolves {{secret:NAME}} references and placeholders. Nil
	// fails every request that needs a secret with 502.
	Secrets SecretSource
}

// Server runs the DNS resolver and the proxies of every sandbox attached
// to it. One Server serves the whole daemon; each sandbox gets its own
// sockets on its own host address, so the source of a connection never
// decides whose policy applies. Methods are safe for concurrent use.
type Server struct {
	cfg    Config
	limits Limits
	log    *slog.Logger
	res    *resolver
	routes *netlink.Handle

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	closed    bool
}

// New returns a Server. It opens a netlink socket for route lookups (to
// recognize the host's own addresses) and starts nothing else.
func New(cfg Config) (*Server, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "egress: no upstream DNS resolver configured")
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink route socket: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: dialTimeout}
		cfg.Dial = func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a.String())
		}
	}
	return &Server{
		cfg:       cfg,
		limits:    cfg.Limits.withDefaults(),
		log:       cfg.Logger,
		res:       newResolver(cfg.Upstreams),
		routes:    h,
		sandboxes: map[string]*sandbox{},
	}, nil
}

// CA returns the CA the proxy intercepts TLS with, or nil. Sandboxes
// need its certificate (CA.CertPEM) in their trust stores.
func (s *Server) CA() *CA { return s.cfg.CA }

// Ports returns the configured ports.
func (s *Server) Ports() Ports { return s.cfg.Ports }

// Addrs are the addresses a sandbox's listeners are bound to.
type Addrs struct {
	DNS, Transparent, HTTPProxy netip.AddrPort
}

// Attach starts the DNS resolver and proxies of sandbox id on addr, its
// host address, under policy p. addr must already be configured on a host
// interface. Errors from binding wrap errdefs.ErrUnavailable; a second
// Attach of the same id fails with errdefs.ErrAlreadyExists.
func (s *Server) Attach(ctx context.Context, id string, addr netip.Addr, p Policy) (Addrs, error) {
	p, err := p.Normalize()
	if err != nil {
		return Addrs{}, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Addrs{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "egress server closed")
	}
	if _, ok := s.sandboxes[id]; ok {
		s.mu.Unlock()
		return Addrs{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "egress for sandbox %s already attached", id)
	}
	s.sandboxes[id] = nil // reserve the id while binding
	s.mu.Unlock()

	sb, err := s.start(ctx, id, addr, p)
	s.mu.Lock()
	if err == nil && s.closed {
		err = errdefs.Errorf(errdefs.ErrFailedPrecondition, "egress server closed")
	} else if err == nil {
		s.sandboxes[id] = sb
		s.mu.Unlock()
		return sb.addrs, nil
	}
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if sb != nil {
		sb.stop()
	}
	return Addrs{}, err
}

// SetPolicy replaces a sandbox's policy. New DNS queries, connections and
// HTTP requests use it at once; spliced connections already open keep
// running. Unknown ids fail with errdefs.ErrNotFound.
func (s *Server) SetPolicy(id string, p Policy) error {
	p, err := p.Normalize()
	if err != nil {
		return err
	}
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "egress for sandbox %s not attached", id)
	}
	sb.policy.Store(&p)
	return nil
}

// Detach stops a sandbox's resolver and proxies, closes its open
// connections and waits for their goroutines. Detaching an unknown id is
// not an error.
func (s *Server) Detach(id string) error {
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb != nil {
		delete(s.sandboxes, id)
	}
	s.mu.Unlock()
	if sb != nil {
		sb.stop()
	}
	return nil
}

// Close detaches every sandbox and releases the Server.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	all := s.sandboxes
	s.sandboxes = map[string]*sandbox{}
	s.mu.Unlock()
	for _, sb := range all {
		if sb != nil {
			sb.stop()
		}
	}
	s.routes.Close()
	return nil
}

// sandbox is one attached sandbox: its policy and the listeners and
// goroutines serving it. All goroutines are owned by it and end in stop.
type sandbox struct {
	srv    *Server
	id     string
	addrs  Addrs
	policy atomic.Pointer[Policy]

	ctx    context.Context // canceled by stop: aborts lookups, dials, requests
	cancel context.CancelFunc

	dnsUDP, dnsTCP *dns.Server
	transparent    net.Listener
	httpSrv        *http.Server
	httpQueue      *connQueue // transparent plaintext HTTP, handed to httpSrv
	tlsSrv         *http.Server
	tlsQueue       *connQueue // intercepted TLS, handed to tlsSrv
	tlsConfig      *tls.Config
	transport      *http.Transport
	proxy          *httputil.ReverseProxy
	queries        chan struct{} // DNS upstream semaphore

	serving sync.WaitGroup // accept loops and Serve calls, started in start
	active  tracker        // connection handlers and their sockets
}

func (s *Server) start(ctx context.Context, id string, addr netip.Addr, p Policy) (_ *sandbox, err error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sb := &sandbox{srv: s, id: id, ctx: sctx, cancel: cancel, queries: make(chan struct{}, s.limits.MaxQueries)}
	sb.policy.Store(&p)
	sb.active.init()

	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
			cancel()
		}
	}()
	var lc net.ListenConfig
	listen := func(port uint16) (net.Listener, error) {
		ln, err := lc.Listen(ctx, "tcp4", netip.AddrPortFrom(addr, port).String())
		if err != nil {
			return nil, fmt.Errorf("listening on %s port %d for sandbox %s: %w: %w", addr, port, id, errdefs.ErrUnavailable, err)
		}
		closers = append(closers, func() { ln.Close() })
		return ln, nil
	}
	// DNS needs the same port for UDP and TCP. With an ephemeral port
	// (tests), the TCP port may be taken: try a few.
	var (
		pc    net.PacketConn
		dnsLn net.Listener
	)
	for attempt := 0; ; attempt++ {
		pc, err = lc.ListenPacket(ctx, "udp4", netip.AddrPortFrom(addr, s.cfg.Ports.DNS).String())
		if err != nil {
			return nil, fmt.Errorf("listening on %s udp port %d for sandbox %s: %w: %w", addr, s.cfg.Ports.DNS, id, errdefs.ErrUnavailable, err)
		}
		dnsLn, err = lc.Listen(ctx, "tcp4", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		if s.cfg.Ports.DNS != 0 || attempt == 10 {
			return nil, fmt.Errorf("listening on %s tcp port %d for sandbox %s: %w: %w", addr, s.cfg.Ports.DNS, id, errdefs.ErrUnavailable, err)
		}
	}
	closers = append(closers, func() { pc.Close() }, func() { dnsLn.Close() })
	dnsPort := pc.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	tln, err := listen(s.cfg.Ports.Transparent)
	if err != nil {
		return nil, err
	}
	hln, err := listen(s.cfg.Ports.HTTPProxy)
	if err != nil {
		return nil, err
	}
	sb.addrs = Addrs{
		DNS:         netip.AddrPortFrom(addr, dnsPort),
		Transparent: tln.Addr().(*net.TCPAddr).AddrPort(),
		HTTPProxy:   hln.Addr().(*net.TCPAddr).AddrPort(),
	}

	if err := sb.startDNS(pc, newLimitListener(dnsLn, s.limits.MaxConns)); err != nil {
		return nil, err
	}
	sb.transparent = newLimitListener(tln, s.limits.MaxConns)
	sb.httpQueue = newConnQueue(tln.Addr())
	sb.startHTTP(newLimitListener(hln, s.limits.MaxConns))
	sb.startIntercept(tln.Addr())
	sb.serving.Go(sb.acceptTransparent)
	s.log.Debug("egress attached", "sandbox_id", id, "addr", addr.String())
	return sb, nil
}

func (sb *sandbox) startDNS(pc net.PacketConn, ln net.Listener) error {
	sb.dnsUDP = &dns.Server{PacketConn: pc, Handler: sb}
	sb.dnsTCP = &dns.Server{Listener: ln, Handler: sb, ReadTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 5 * time.Second }}
	for _, srv := range []*dns.Server{sb.dnsUDP, sb.dnsTCP} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		failed := make(chan error, 1)
		sb.serving.Go(func() {
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
			}
		})
		select {
		case <-started:
		case err := <-failed:
			sb.stopDNS()
			return fmt.Errorf("starting DNS for sandbox %s: %w", sb.id, err)
		}
	}
	return nil
}

func (sb *sandbox) stopDNS() {
	for _, srv := range []*dns.Server{sb.dnsUDP, sb.dnsTCP} {
		// Shutdown fails only for a server that never started; its
		// listener is closed by the caller's undo steps then.
		_ = srv.Shutdown()
	}
}

func (sb *sandbox) startHTTP(explicit net.Listener) {
	sb.transport = &http.Transport{
		Proxy: nil, // never the host's HTTP_PROXY
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			p := sb.policy.Load()
			if rt, ok := ctx.Value(routeKey{}).(*route); ok {
				p = rt.policy
			}
			return sb.dial(ctx, host, port, p)
		},
		// Upstream TLS (intercepted connections only) is verified for
		// the request's host, which is the sandbox's SNI.
		TLSClientConfig:       &tls.Config{RootCAs: sb.srv.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   dialTimeout,
		ForceAttemptHTTP2:     true, // DialContext is custom
		DisableCompression:    true, // pass Accept-Encoding through untouched
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	sb.proxy = &httputil.ReverseProxy{
		Rewrite:      sb.rewrite,
		Transport:    sb.transport,
		ErrorHandler: sb.proxyError,
		ErrorLog:     log.New(discard{}, "", 0),
	}
	sb.httpSrv = &http.Server{
		Handler:           http.HandlerFunc(sb.serveHTTP),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return sb.ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*transparentConn); ok {
				return context.WithValue(ctx, connKey{}, tc)
			}
			return ctx
		},
		ErrorLog: log.New(discard{}, "", 0),
	}
	for _, ln := range []net.Listener{explicit, sb.httpQueue} {
		sb.serving.Go(func() { _ = sb.httpSrv.Serve(ln) })
	}
}

// stop closes every listener and connection of the sandbox and waits for
// every goroutine it started.
func (sb *sandbox) stop() {
	sb.cancel()
	sb.stopDNS()
	sb.transparent.Close()
	sb.httpSrv.Close() // closes the explicit listener, the queue and idle HTTP conns
	sb.tlsSrv.Close()
	sb.active.shutdown()
	sb.serving.Wait()
	sb.active.wait()
	sb.transport.CloseIdleConnections()
	sb.srv.log.Debug("egress detached", "sandbox_id", sb.id)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// tracker counts connection handlers and holds their sockets, so that stop
// can close the sockets and wait for the handlers.
type tracker struct {
	mu     sync.Mutex
	closed bool
	n      int
	idle   chan struct{}
	conns  map[net.Conn]struct{}
}

func (t *tracker) init() { t.conns = map[net.Conn]struct{}{} }

// enter registers a running handler; false means shutdown has begun.
func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

// exit unregisters a handler.
func (t *tracker) exit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// hold registers a socket to be closed by shutdown; false means shutdown
// has begun, and the socket was closed.
func (t *tracker) hold(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// release forgets a socket; its handler closes it or handed it on.
func (t *tracker) release(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.conns, c)
}

// shutdown refuses new handlers and closes every held socket.
func (t *tracker) shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
}

// wait returns once no handler runs; call it after shutdown.
func (t *tracker) wait() {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	t.idle = idle
	t.mu.Unlock()
	<-idle
}

// limitListener admits at most n open connections; Accept waits for a
// slot, so excess connections queue in the kernel backlog.
type limitListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// connQueue is a net.Listener fed by the transparent proxy with the
// plaintext HTTP connections it sniffed, for the sandbox's http.Server.
type connQueue struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

// put hands c to the http.Server; it closes c if the queue is closed.
func (q *connQueue) put(c net.Conn) {
	select {
	case q.ch <- c:
	case <-q.done:
		c.Close()
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// splitHostPort splits an authority ("host", "host:port", "[v6]:port")
// into a host without brackets and a port, using def when none is given.
func splitHostPort(authority string, def uint16) (string, uint16, error) {
	host, portStr, err := net.SplitHostPort(authority)
	if err != nil {
		var aerr *net.AddrError
		if errors.As(err, &aerr) && aerr.Err == "missing port in address" {
			return authority, def, nil
		}
		return "", 0, fmt.Errorf("bad authority %q: %w", authority, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("bad port in %q", authority)
	}
	return host, uint16(port), nil
}
