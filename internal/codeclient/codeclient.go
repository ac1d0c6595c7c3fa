// Package codeclient is the daemon's client of the code interpreter
// service inside a sandbox (package interpreter, on interpreter.Port),
// shared by the REST API and the MCP server. It reaches the service
// through the Manager's port path (sandbox.Manager.DialPort), as any
// server in a sandbox is reached, and turns its answers into errdefs
// errors and interpreter.Events.
//
// It does not check tenancy or sandbox state (the Manager's DialPort
// does) and holds no state but idle connections.
package codeclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/interpreter"
	"github.com/corralrun/corral/internal/wire"
)

// MaxLine bounds one line of an execution stream: a result (an image,
// say) larger than this ends the stream with an error instead of being
// held in the daemon's memory.
const MaxLine = 64 << 20

// Dialer connects to port of sandbox id (sandbox.Manager.DialPort).
type Dialer func(ctx context.Context, id string, port int) (net.Conn, error)

// Client talks to the code interpreters of sandboxes. Safe for concurrent
// use.
type Client struct {
	hc *http.Client
}

// AddrDialer turns dial into an http.Transport's DialContext for URLs
// whose host is "<sandbox id>:<port>".
func AddrDialer(dial Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		id, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return nil, err
		}
		return dial(ctx, id, n)
	}
}

// New returns a client that reaches sandboxes with dial.
func New(dial Dialer) *Client {
	byAddr := AddrDialer(dial)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := byAddr(ctx, network, addr)
			if errdefs.Code(err) == errdefs.CodeUnavailable {
				id, _, _ := net.SplitHostPort(addr)
				n := interpreter.Port
				return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition,
					"sandbox %s runs no code interpreter on port %d: create it from a template whose service is the code interpreter (`corral template build NAME --recipe code-interpreter`)", id, n)
			}
			return c, err
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

// CloseIdle closes idle connections to sandboxes.
func (c *Client) CloseIdle() { c.hc.CloseIdleConnections() }

func target(id, path string) string {
	return "http://" + net.JoinHostPort(id, strconv.Itoa(interpreter.Port)) + path
}

// do sends a JSON request and returns the response, or the service's
// error as an errdefs error.
func (c *Client) do(ctx context.Context, method, id, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target(id, path), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errdefs.Code(err) == errdefs.CodeInternal && ctx.Err() == nil {
			err = fmt.Errorf("code interpreter of sandbox %s: %w", id, errors.Join(errdefs.ErrUnavailable, err))
		}
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, fmt.Errorf("code interpreter of sandbox %s: %w", id, wire.DecodeError(resp))
	}
	return resp, nil
}

// Execute runs req in sandbox id and calls fn for each event, the end
// event last. An error from fn stops the stream (and, as the connection
// closes, interrupts the execution).
func (c *Client) Execute(ctx context.Context, id string, req interpreter.ExecuteRequest, fn func(interpreter.Event) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, id, "/execute", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readLine(r)
		if err == io.EOF {
			return fmt.Errorf("code interpreter of sandbox %s: the stream ended before the execution did: %w", id, errdefs.ErrUnavailable)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading the execution stream of sandbox %s: %w", id, err)
		}
		var e interpreter.Event
		if err := json.Unmarshal(line, &e); err != nil {
			return fmt.Errorf("code interpreter of sandbox %s sent %.100q: %w", id, line, err)
		}
		if e.Type == interpreter.EventKeepalive {
			continue
		}
		if err := fn(e); err != nil {
			return err
		}
		if e.Type == interpreter.EventEnd {
			return nil
		}
	}
}

// readLine reads one line of at most MaxLine bytes, without its newline.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxLine {
			return nil, fmt.Errorf("a line of the stream is longer than %d bytes", MaxLine)
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return line, nil
		default:
			return nil, err
		}
	}
}

// Contexts lists the contexts of sandbox id.
func (c *Client) Contexts(ctx context.Context, id string) ([]interpreter.ContextInfo, error) {
	var out []interpreter.ContextInfo
	return out, c.call(ctx, http.MethodGet, id, "/contexts", nil, &out)
}

// CreateContext starts a context in sandbox id.
func (c *Client) CreateContext(ctx context.Context, id string, req interpreter.ContextRequest) (interpreter.ContextInfo, error) {
	var out interpreter.ContextInfo
	return out, c.call(ctx, http.MethodPost, id, "/contexts", req, &out)
}

// RestartContext restarts context cid of sandbox id: its kernel starts
// anew, without variables.
func (c *Client) RestartContext(ctx context.Context, id, cid string) (interpreter.ContextInfo, error) {
	var out interpreter.ContextInfo
	return out, c.call(ctx, http.MethodPost, id, "/contexts/"+url.PathEscape(cid)+"/restart", nil, &out)
}

// DeleteContext stops context cid of sandbox id.
func (c *Client) DeleteContext(ctx context.Context, id, cid string) error {
	return c.call(ctx, http.MethodDelete, id, "/contexts/"+url.PathEscape(cid), nil, nil)
}

func (c *Client) call(ctx context.Context, method, id, path string, body, out any) error {
	resp, err := c.do(ctx, method, id, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("code interpreter of sandbox %s: decoding %s %s: %w", id, method, path, err)
	}
	return nil
}
