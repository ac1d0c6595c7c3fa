package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Attach message prefixes: the first byte of every binary message.
const (
	attachStdin  = 0
	attachStdout = 1
	attachStderr = 2
)

const (
	// attachReadLimit bounds one client message; stdin arrives in many.
	attachReadLimit = 1 << 20
	// stdinGrace is how long stdin already received may take to reach a
	// process after the session ended, before the write is abandoned.
	stdinGrace = 2 * time.Second
)

// attachProcess connects a WebSocket to a process: its output (replayed
// from the from query parameter, then live) goes out as binary messages,
// stdin and control messages come in. The protocol is described in
// openapi.json under attachProcess.
//
// Origins: the WebSocket handshake is accepted from any Origin. Browsers
// protect WebSockets only through the server's origin check, but this API
// never relies on ambient credentials: it is reached through a root-only
// unix socket or with an API key that a browser does not attach on its
// own, so a foreign page can open nothing it could not open anyway.
func (s *Server) attachProcess(w http.ResponseWriter, r *http.Request) {
	from, err := queryOffset(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.proc(func(ag *agentclient.Client, pid int) (int, any, error) {
		// Check the process before upgrading, so that a wrong pid is an
		// ordinary 404.
		if _, err := ag.Process(r.Context(), pid); err != nil {
			return 0, nil, err
		}
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			return 0, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "attach needs a WebSocket upgrade (Upgrade: websocket); use /output to read output over plain HTTP")
		}
		conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return 0, nil, nil // Accept has answered the client.
		}
		conn.SetReadLimit(attachReadLimit)
		a := &attachment{conn: conn, ag: ag, pid: pid, log: s.log, redact: s.redactor(r)}
		defer s.m.Active(r.PathValue("id"))() // an open session holds off the idle timeout
		a.run(r.Context(), from)
		return 0, nil, nil
	})(w, r)
}

// attachment is one WebSocket attach session. run owns every goroutine it
// starts and returns after all of them ended.
type attachment struct {
	conn *websocket.Conn
	ag   *agentclient.Client
	pid  int
	log  *slog.Logger
	// redact is what the client may see of an error.
	redact func(error) error
}

func (a *attachment) run(ctx context.Context, from int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := newStdinPipe(ctx, a.ag, a.pid)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The client leaving (or breaking the protocol) ends the session.
		defer cancel()
		a.readInput(ctx, in)
	}()

	exited := false
	err := a.ag.ProcessOutput(ctx, a.pid, from, true, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStart:
			return a.sendEvent(ctx, AttachEvent{Type: wire.EventStart, PID: ev.PID, Dropped: ev.Dropped})
		case wire.EventStdout, wire.EventStderr:
			prefix := byte(attachStdout)
			if ev.Type == wire.EventStderr {
				prefix = attachStderr
			}
			data := ev.Bytes()
			msg := make([]byte, 1+len(data))
			msg[0] = prefix
			copy(msg[1:], data)
			return a.conn.Write(ctx, websocket.MessageBinary, msg)
		case wire.EventExit:
			exited = true
			return a.sendEvent(ctx, AttachEvent{Type: wire.EventExit, ExitCode: ev.ExitCode, Signal: ev.Signal, TimedOut: ev.TimedOut})
		}
		return nil
	})
	switch {
	case exited:
		// Stdin is moot once the process ended; closing it first also
		// frees the reader for the close handshake.
		in.close()
		_ = a.conn.Close(websocket.StatusNormalClosure, "process exited")
	case ctx.Err() != nil:
		// The client left; nobody is there to tell.
		_ = a.conn.CloseNow()
	default:
		if err == nil {
			err = errdefs.Errorf(errdefs.ErrUnavailable, "output stream of process %d ended before it exited", a.pid)
		}
		a.log.Debug("attach output stream failed", "pid", a.pid, "error", err)
		_ = a.sendError(ctx, err)
		in.close()
		_ = a.conn.Close(websocket.StatusInternalError, "output stream failed")
	}
	cancel()
	_ = a.conn.CloseNow()
	wg.Wait()
	in.finish(stdinGrace)
}

// readInput handles the client's messages until the connection ends.
func (a *attachment) readInput(ctx context.Context, in *stdinPipe) {
	for {
		typ, msg, err := a.conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if len(msg) == 0 || msg[0] != attachStdin {
				err = errdefs.Errorf(errdefs.ErrInvalidArgument, "binary messages must start with byte 0 (stdin)")
			} else if len(msg) > 1 {
				err = in.write(msg[1:])
			}
		} else {
			err = a.control(ctx, in, msg)
		}
		if err != nil && ctx.Err() == nil {
			if a.sendError(ctx, err) != nil {
				return
			}
		}
	}
}

// control carries out one JSON control message.
func (a *attachment) control(ctx context.Context, in *stdinPipe, msg []byte) error {
	var c AttachControl
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid control message: %v", err)
	}
	switch c.Type {
	case "resize":
		if err := checkPTYSize(wire.PTYSize{Cols: c.Cols, Rows: c.Rows}); err != nil {
			return err
		}
		return a.ag.Resize(ctx, a.pid, wire.PTYSize{Cols: c.Cols, Rows: c.Rows})
	case "signal":
		if c.Signal == "" {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "signal message needs a signal")
		}
		return a.ag.Signal(ctx, a.pid, c.Signal)
	case "close_stdin":
		return in.closeStdin(ctx)
	}
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown control message type %q (want resize, signal or close_stdin)", c.Type)
}

func (a *attachment) sendEvent(ctx context.Context, ev AttachEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return a.conn.Write(ctx, websocket.MessageText, b)
}

func (a *attachment) sendError(ctx context.Context, err error) error {
	return a.sendEvent(ctx, AttachEvent{Type: wire.EventError, Error: errorOf(a.redact(err))})
}

// stdinPipe forwards a session's stdin messages to the process through one
// long streaming request (Client.WriteStdin fed by a pipe), opened with the
// first message so that sessions that send no input cost no request. Each
// message is handed to the request as it arrives, which keeps keystroke
// latency at one chunk. write, closeStdin and close are called from the
// session's reader; finish from its owner once the reader ended.
type stdinPipe struct {
	ctx    context.Context // ends the request; canceled by finish
	cancel context.CancelFunc
	ag     *agentclient.Client
	pid    int

	mu     sync.Mutex
	pw     *io.PipeWriter
	done   chan struct{} // closed when the request returned
	closed bool          // no more input is accepted
}

func newStdinPipe(ctx context.Context, ag *agentclient.Client, pid int) *stdinPipe {
	// The request outlives the session's context by a grace period (see
	// finish), so that input sent just before the end is delivered.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &stdinPipe{ctx: sctx, cancel: cancel, ag: ag, pid: pid}
}

// write hands b to the process, opening the request on first use. It
// blocks while the process does not read.
func (p *stdinPipe) write(b []byte) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "stdin of process %d is closed", p.pid)
	}
	if p.pw == nil {
		pr, pw := io.Pipe()
		p.pw, p.done = pw, make(chan struct{})
		go func() {
			err := p.ag.WriteStdin(p.ctx, p.pid, pr)
			if err == nil {
				err = errdefs.Errorf(errdefs.ErrFailedPrecondition, "stdin of process %d is closed", p.pid)
			}
			// A write still waiting in the pipe returns this error.
			_ = pr.CloseWithError(err)
			close(p.done)
		}()
	}
	pw := p.pw
	p.mu.Unlock()
	if _, err := pw.Write(b); err != nil {
		if errors.Is(err, io.ErrClosedPipe) {
			return nil // the session is ending; close dropped the input
		}
		return err
	}
	return nil
}

// closeStdin ends the stream after what was written and closes the
// process's stdin.
func (p *stdinPipe) closeStdin(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	pw, done := p.pw, p.done
	p.mu.Unlock()
	if pw != nil {
		_ = pw.Close()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.ag.CloseStdin(ctx, p.pid)
}

// close stops accepting input and ends the stream after what was written;
// a write blocked in the pipe returns.
func (p *stdinPipe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.pw != nil {
		_ = p.pw.Close()
	}
}

// finish closes the stream and waits up to grace for the request to
// deliver what it holds before canceling it.
func (p *stdinPipe) finish(grace time.Duration) {
	p.close()
	defer p.cancel()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		p.cancel()
		<-done
	}
}
