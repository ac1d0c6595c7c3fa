package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxHello bounds how much of a TLS ClientHello the proxy buffers. Hellos
// with post-quantum key shares are about 2 KB; 64 KB is generous.
const maxHello = 64 << 10

var (
	errHelloRead  = errors.New("client hello read")
	errReadOnly   = errors.New("read-only connection")
	errHelloLarge = errors.New("client hello too large")
)

// readClientHello reads a TLS ClientHello from r and returns its SNI
// server name (empty if the client sent none) and every byte it read, to be
// replayed to the upstream. It uses crypto/tls as the parser: a server
// handshake on a read-only connection whose GetConfigForClient hook records
// the hello and aborts, so nothing is ever written to the client and TLS is
// not terminated. ok is false when the bytes are not a well-formed hello
// (crypto/tls also rejects an SNI with a trailing dot or an IP literal,
// which RFC 6066 §3 forbids).
func readClientHello(ctx context.Context, r io.Reader) (sni string, raw []byte, ok bool) {
	hc := &helloConn{r: r}
	var got bool
	cfg := &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, got = h.ServerName, true
			return nil, errHelloRead
		},
	}
	_ = tls.Server(hc, cfg).HandshakeContext(ctx)
	return sni, hc.rec.Bytes(), got
}

// helloConn is the net.Conn crypto/tls reads the hello from: reads are
// recorded, writes (the alert crypto/tls sends when the hook aborts) fail.
type helloConn struct {
	r   io.Reader
	rec bytes.Buffer
}

func (c *helloConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.rec.Write(p[:n])
	if c.rec.Len() > maxHello {
		return n, errHelloLarge
	}
	return n, err
}

func (c *helloConn) Write([]byte) (int, error)        { return 0, errReadOnly }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }

// tlsAccessDenied is a fatal TLS alert record, access_denied(49) (RFC 8446
// §6), sent before closing a refused TLS connection so that clients print a
// clear reason instead of "connection reset".
const tlsAccessDenied = "\x15\x03\x03\x00\x02\x02\x31"

// originalDst returns the destination the sandbox addressed before the
// nftables DNAT rule sent it to the proxy: getsockopt(SOL_IP,
// SO_ORIGINAL_DST) reads it from the connection's conntrack entry and
// fills a struct sockaddr_in. The proxy uses only the port (to know what
// the sandbox meant to reach) and logs the address; it never dials it.
func originalDst(c *net.TCPConn) (netip.AddrPort, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, false
	}
	var (
		m    *unix.IPv6Mreq
		gerr error
	)
	// struct sockaddr_in is 16 bytes, the size of an ipv6_mreq: the usual
	// way to read it without cgo.
	if err := rc.Control(func(fd uintptr) {
		m, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil || gerr != nil {
		return netip.AddrPort{}, false
	}
	b := m.Multiaddr
	if b[0] != unix.AF_INET || b[1] != 0 { // sa_family in host (little) endian
		return netip.AddrPort{}, false
	}
	port := uint16(b[2])<<8 | uint16(b[3])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port), true
}

// prefixConn replays bytes already read from a connection before reading
// more from it.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// splice copies both ways until both directions end, passing half-closes
// on, then closes both connections. On Linux, io.Copy between two
// *net.TCPConn uses splice(2), so the payload never enters user space.
func splice(a, b net.Conn) {
	ra, rb := rawConn(a), rawConn(b)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(rb, ra)
		closeWrite(rb)
	})
	_, _ = io.Copy(ra, rb)
	closeWrite(ra)
	wg.Wait()
	a.Close()
	b.Close()
}

// rawConn unwraps the proxy's own connection wrappers so that io.Copy sees
// *net.TCPConn on both sides and can splice.
func rawConn(c net.Conn) net.Conn {
	for {
		switch w := c.(type) {
		case *limitedConn:
			c = w.Conn
		default:
			return c
		}
	}
}

func closeWrite(c net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}
