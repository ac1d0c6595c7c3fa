package corral

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// AttachOptions connect a process's terminal or pipes to local streams.
type AttachOptions struct {
	// From is the output offset to replay from (0: everything still
	// buffered).
	From int64
	// Stdin, when set, is forwarded to the process as it is read. Nil
	// sends nothing.
	//
	// Attach does not wait for a Read on Stdin that is still blocked when
	// the session ends: that Read's goroutine ends as soon as the Read
	// returns, and what it read is dropped. Pass a Stdin that can be made
	// to return (a pipe you close) when that matters.
	Stdin io.Reader
	// CloseStdin closes the process's stdin when Stdin ends (for a PTY
	// process that means sending ^D); otherwise the end of Stdin only
	// stops the forwarding.
	CloseStdin bool
	// Stdout and Stderr receive output; nil discards it. A PTY process has
	// only stdout.
	Stdout, Stderr io.Writer
	// Resize, when set, delivers new terminal sizes for a PTY process.
	Resize <-chan PTYSize
	// OnError, when set, is called with failures the session survives
	// (a refused resize or signal, stdin that cannot be written).
	OnError func(error)
}

// attachEvent is a text message from the server.
type attachEvent struct {
	Type     string `json:"type"`
	PID      int    `json:"pid"`
	Dropped  int64  `json:"dropped"`
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timed_out"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// attachControl is a text message to the server.
type attachControl struct {
	Type   string `json:"type"`
	Cols   uint16 `json:"cols,omitempty"`
	Rows   uint16 `json:"rows,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// maxAttachMessage bounds one message from the server (an output chunk).
const maxAttachMessage = 16 << 20

// Attach connects to a process over a WebSocket: it replays the buffered
// output from opts.From, then streams live output to opts.Stdout and
// opts.Stderr and opts.Stdin to the process, until the process exits
// (returning how it ended) or ctx ends or the connection fails (returning
// the error). Leaving does not stop the process.
func (c *Client) Attach(ctx context.Context, id string, pid int, opts AttachOptions) (*ExecResult, error) {
	conn, err := c.dialAttach(ctx, id, pid, opts.From)
	if err != nil {
		return nil, err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxAttachMessage)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.Stdin != nil {
		// Not waited for: see AttachOptions.Stdin.
		go pumpStdin(ctx, conn, opts.Stdin, opts.CloseStdin)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if opts.Resize != nil {
		wg.Go(func() { forwardResizes(ctx, conn, opts.Resize) })
	}
	return readAttach(ctx, conn, pid, opts)
}

// dialAttach opens the attach WebSocket of process pid, replaying output
// from offset from. A refused upgrade returns the server's error.
func (c *Client) dialAttach(ctx context.Context, id string, pid int, from int64) (*websocket.Conn, error) {
	u := c.base + processPath(id, pid, "/attach")
	if from > 0 {
		u += "?from=" + strconv.FormatInt(from, 10)
	}
	hdr := http.Header{}
	if c.apiKey != "" {
		hdr.Set("Authorization", "Bearer "+c.apiKey)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("corral daemon unreachable: %w", err)
	}
	return conn, nil
}

// forwardResizes sends each size from sizes as a resize message until
// sizes is closed, ctx ends or a send fails.
func forwardResizes(ctx context.Context, conn *websocket.Conn, sizes <-chan PTYSize) {
	for {
		select {
		case <-ctx.Done():
			return
		case size, ok := <-sizes:
			if !ok {
				return
			}
			if sendControl(ctx, conn, attachControl{Type: "resize", Cols: size.Cols, Rows: size.Rows}) != nil {
				return
			}
		}
	}
}

// readAttach reads the server's messages until the connection ends:
// output goes to opts' writers, the exit event becomes the result, and
// error events go to opts.OnError and explain a connection the server
// then closes.
func readAttach(ctx context.Context, conn *websocket.Conn, pid int, opts AttachOptions) (*ExecResult, error) {
	var res *ExecResult
	var lastErr error
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return attachEnded(ctx, err, res, lastErr)
		}
		if typ == websocket.MessageBinary {
			if err := writeAttachOutput(msg, opts); err != nil {
				return nil, err
			}
			continue
		}
		var ev attachEvent
		if err := json.Unmarshal(msg, &ev); err != nil {
			return nil, fmt.Errorf("decoding attach message: %w", err)
		}
		switch ev.Type {
		case "exit":
			res = &ExecResult{PID: pid, Signal: ev.Signal, TimedOut: ev.TimedOut}
			if ev.ExitCode != nil {
				res.ExitCode = *ev.ExitCode
			}
		case "error":
			lastErr = &Error{Status: http.StatusOK, Code: CodeInternal, Message: "attach failed without a reason"}
			if ev.Error != nil {
				lastErr = &Error{Status: http.StatusOK, Code: ev.Error.Code, Message: ev.Error.Message}
			}
			if opts.OnError != nil {
				opts.OnError(lastErr)
			}
		}
	}
}

// attachEnded is Attach's answer once reading failed with err: the exit
// when one came, else why the session ended.
func attachEnded(ctx context.Context, err error, res *ExecResult, lastErr error) (*ExecResult, error) {
	switch {
	case res != nil:
		return res, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case lastErr != nil && websocket.CloseStatus(err) == websocket.StatusInternalError:
		// The server reports why before it gives up.
		return nil, lastErr
	}
	return nil, fmt.Errorf("attach connection lost: %w", err)
}

// writeAttachOutput writes an output message (its first byte the stream:
// 2 for stderr, else stdout) to the matching writer of opts, if any.
func writeAttachOutput(msg []byte, opts AttachOptions) error {
	if len(msg) == 0 {
		return nil
	}
	w := opts.Stdout
	if msg[0] == 2 {
		w = opts.Stderr
	}
	if w == nil {
		return nil
	}
	if _, err := w.Write(msg[1:]); err != nil {
		return fmt.Errorf("writing output: %w", err)
	}
	return nil
}

func sendControl(ctx context.Context, conn *websocket.Conn, c attachControl) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

// pumpStdin forwards r to the process until r ends (then, with
// closeAtEnd, closes the process's stdin) or the connection fails.
func pumpStdin(ctx context.Context, conn *websocket.Conn, r io.Reader, closeAtEnd bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if ctx.Err() != nil {
			return
		}
		if n > 0 {
			msg := make([]byte, 1+n)
			copy(msg[1:], buf[:n])
			if conn.Write(ctx, websocket.MessageBinary, msg) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			if closeAtEnd {
				_ = sendControl(ctx, conn, attachControl{Type: "close_stdin"})
			}
			return
		}
		if err != nil {
			return
		}
	}
}
