package agentclient

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/wire"
)

// Connect returns a connection to TCP port of 127.0.0.1 inside the
// sandbox, carried by a connection of its own to the agent (GET /connect,
// upgraded). ctx bounds the dial and the upgrade, not the connection that
// is returned. Nothing listening on the port is errdefs.ErrUnavailable, as
// the agent answers it.
func (c *Client) Connect(ctx context.Context, port int) (net.Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, &unavailableError{fmt.Errorf("dialing agent: %w", err)}
	}
	// The handshake honors ctx; the connection then lives on its own.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	br, resp, err := connectHandshake(conn, port)
	if !stop() || err != nil {
		conn.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, wire.DecodeError(resp)
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

func connectHandshake(conn net.Conn, port int) (*bufio.Reader, *http.Response, error) {
	req := "GET /connect?port=" + strconv.Itoa(port) + " HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return nil, nil, &unavailableError{fmt.Errorf("connecting to port %d: %w", port, err)}
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, &unavailableError{fmt.Errorf("connecting to port %d: reading the agent's answer: %w", port, err)}
	}
	return br, resp, nil
}

// bufferedConn reads what the handshake's reader holds before the rest.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes when the underlying connection can.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
