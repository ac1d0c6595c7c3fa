// Package agentdialout is the daemon's end of agents that dial out: an agent
// in a gVisor sandbox (which cannot accept on a host socket) or a VM (one
// serial port) opens a single connection to a per-sandbox unix socket on
// the host, and both ends run a yamux session over it. The agent serves the
// ordinary agent protocol on the streams the daemon opens, so everything
// above a driver's DialAgent is the same for every runtime.
//
// The package owns the listening socket and the current session. It knows
// nothing of sandboxes or drivers.
package agentdialout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corralrun/corral/internal/errdefs"
)

// Config returns the yamux settings both ends use: keep-alives detect a
// peer that vanished (a killed daemon, a restored copy) within seconds.
func Config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 5 * time.Second
	c.ConnectionWriteTimeout = 10 * time.Second
	c.MaxStreamWindowSize = 1 << 20
	c.LogOutput = io.Discard
	return c
}

// Listener accepts an agent's connections on a unix socket and opens
// streams to the newest one. Safe for concurrent use.
type Listener struct {
	ln  *net.UnixListener
	log *slog.Logger

	mu      sync.Mutex
	sess    *yamux.Session
	changed chan struct{} // closed and replaced whenever sess changes
	closed  bool

	done chan struct{}
}

// Listen creates the socket at path (removing a stale one) and starts
// accepting. The caller must Close the Listener.
func Listen(path string, log *slog.Logger) (*Listener, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale agent socket %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening for the agent on %s: %w", path, err)
	}
	l := &Listener{ln: ln, log: log, changed: make(chan struct{}), done: make(chan struct{})}
	go l.accept()
	return l, nil
}

// accept takes connections until the listener closes; each new one
// replaces the session before it, since an agent only re-dials when it
// lost the old connection.
func (l *Listener) accept() {
	defer close(l.done)
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		sess, err := yamux.Client(c, Config())
		if err != nil {
			c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			sess.Close()
			return
		}
		old := l.sess
		l.sess = sess
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
		if old != nil {
			old.Close()
		}
		l.log.Debug("agent connected", "socket", l.ln.Addr().String())
	}
}

// current returns the live session, or nil and a channel that is closed
// when the session changes.
func (l *Listener) current() (*yamux.Session, <-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, errdefs.Errorf(errdefs.ErrUnavailable, "agent listener is closed")
	}
	if l.sess != nil && !l.sess.IsClosed() {
		return l.sess, nil, nil
	}
	return nil, l.changed, nil
}

// WaitConnected blocks until an agent session is up or ctx ends.
func (l *Listener) WaitConnected(ctx context.Context) error {
	for {
		s, changed, err := l.current()
		if err != nil || s != nil {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the agent to connect: %w", errors.Join(errdefs.ErrUnavailable, ctx.Err()))
		}
	}
}

// Dial opens a new stream to the agent, waiting (bounded by ctx) for the
// agent to connect if it is not connected right now.
func (l *Listener) Dial(ctx context.Context) (net.Conn, error) {
	for {
		if err := l.WaitConnected(ctx); err != nil {
			return nil, err
		}
		s, _, err := l.current()
		if err != nil {
			return nil, err
		}
		if s == nil {
			continue
		}
		stream, err := s.OpenStream()
		if err == nil {
			return stream, nil
		}
		if !s.IsClosed() {
			return nil, fmt.Errorf("opening a stream to the agent: %w", errors.Join(errdefs.ErrUnavailable, err))
		}
		// The session died between the check and the open; wait for the
		// agent's next connection.
	}
}

// Drop closes the current session, if any, so that Dial and
// WaitConnected wait for the agent's next connection. It is for a caller
// that knows the connection went stale without either end seeing it (a
// gVisor sandbox checkpointed and left running) and makes the agent dial
// again.
func (l *Listener) Drop() {
	l.mu.Lock()
	sess := l.sess
	l.sess = nil
	l.mu.Unlock()
	if sess != nil {
		sess.Close()
	}
}

// Close stops accepting, closes the session and removes the socket file.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	sess := l.sess
	l.mu.Unlock()
	err := l.ln.Close() // also unlinks the socket file
	<-l.done
	if sess != nil {
		sess.Close()
	}
	return err
}
