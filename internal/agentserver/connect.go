package agentserver

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// connectDialTimeout bounds the agent's connect to a sandbox port.
const connectDialTimeout = 5 * time.Second

// handleConnect serves GET /connect?port=N with "Upgrade: tcp": it
// connects to 127.0.0.1:N inside the sandbox and, on success, answers 101
// Switching Protocols and carries bytes both ways until either side ends.
// This is how the daemon reaches a sandbox port when it cannot dial the
// sandbox's own network stack (gVisor's netstack, VMs). Nothing listening
// is 503 unavailable, before the upgrade.
func (s *Server) handleConnect(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	switch {
	case err != nil || port < 1 || port > 65535:
		wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "port %q: want a number from 1 to 65535", r.URL.Query().Get("port")))
		return
	case !strings.EqualFold(r.Header.Get("Upgrade"), "tcp"):
		wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "connect needs the header Upgrade: tcp"))
		return
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), connectDialTimeout)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			err = errorf(errdefs.ErrUnavailable, "nothing listens on port %d", port)
		} else {
			err = errorf(errdefs.ErrUnavailable, "connecting to port %d: %v", port, err)
		}
		wire.WriteError(w, err)
		return
	}
	defer c.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		wire.WriteError(w, errorf(errdefs.ErrInternal, "taking over the connection: %v", err))
		return
	}
	defer conn.Close()
	if _, err := brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"); err != nil {
		return
	}
	if err := brw.Flush(); err != nil {
		return
	}
	// Each direction ends with a half close, so a request-response
	// protocol sees the other side's EOF; both end before the handler.
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(c, brw.Reader)
		closeWrite(c)
	})
	_, _ = io.Copy(conn, c)
	closeWrite(conn)
	wg.Wait()
}

// closeWrite half-closes c when it can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		return
	}
	_ = c.Close()
}
