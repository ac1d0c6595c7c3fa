package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// baseURL is a placeholder: every request goes over a connection from the
// dial function, whatever the host says.
const baseURL = "http://agent"

// maxJSONResponse bounds a JSON answer (a directory listing is the largest).
const maxJSONResponse = 64 << 20

// Client talks to one sandbox's agent. It keeps a few idle connections for
// reuse, so an exec costs no dial once warm. A Client is safe for
// concurrent use; it starts no goroutines of its own beyond those of its
// HTTP transport, which Close lets go.
//
// Errors: an error answer from the agent is returned as the agent sent it
// (message intact, kind testable with errors.Is). A connection that cannot
// be opened or that breaks wraps errdefs.ErrUnavailable; a canceled ctx
// wraps ctx.Err().
type Client struct {
	tr   *http.Transport
	hc   *http.Client
	dial func(ctx context.Context) (net.Conn, error) // for Connect
}

// New returns a client that opens connections with dial. dial is called
// whenever no idle connection is free, possibly concurrently, and should
// honor ctx.
func New(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, &unavailableError{fmt.Errorf("dialing agent: %w", err)}
			}
			return c, nil
		},
		MaxIdleConns:        4,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{tr: tr, hc: &http.Client{Transport: tr}, dial: dial}
}

// Close closes the idle connections. Requests in flight are not affected,
// and the client stays usable.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// Health asks the agent whether it serves; one round trip.
func (c *Client) Health(ctx context.Context) (wire.Health, error) {
	var h wire.Health
	if err := c.call(ctx, "checking agent health", http.MethodGet, "/health", nil, nil, &h); err != nil {
		return wire.Health{}, err
	}
	return h, nil
}

// Exec runs a process and calls fn for each event of its stream in order,
// on the calling goroutine: start, output chunks, then exit. It returns nil
// after the exit event. A process that cannot start returns the agent's
// error before any event. An error event, a stream that ends without an
// exit event (ErrUnavailable, "agent connection lost") or an error from fn
// ends the call with that error. Returning early or canceling ctx closes
// the request, and the agent then kills the process group.
func (c *Client) Exec(ctx context.Context, req wire.ExecRequest, fn func(wire.ExecEvent) error) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding exec request: %w", err)
	}
	resp, err := c.do(ctx, http.MethodPost, "/exec", nil, "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("starting exec: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return wire.DecodeError(resp)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev wire.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			return streamError(ctx, err)
		}
		if ev.Type == wire.EventError {
			if ev.Error == nil {
				return errdefs.Errorf(errdefs.ErrInternal, "exec stream failed without a reason")
			}
			return errdefs.FromCode(ev.Error.Code, ev.Error.Message)
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.Type == wire.EventExit {
			// Reading the end of the response lets the connection be
			// reused; the agent sends it right after the exit event.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
			return nil
		}
	}
}

// streamError classifies a failure to read the next event of a stream.
func streamError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("reading event stream: %w", ctxErr)
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syntax) || errors.As(err, &typ) {
		return errdefs.Errorf(errdefs.ErrInternal, "reading event stream: malformed event: %v", err)
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return &unavailableError{fmt.Errorf("agent connection lost: %w", err)}
}

// ReadFile opens the file at path (absolute, inside the sandbox) for
// streaming. size is its length, or -1 when the agent does not know it
// (pseudo files). The caller must close the reader; a file cut short by a
// failure reads as io.ErrUnexpectedEOF, never as a clean end.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files", url.Values{"path": {path}}, "", nil)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, wire.DecodeError(resp)
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFile creates or truncates the file at path with exactly mode's
// permission bits, creating missing parents, and streams r into it without
// buffering it whole.
func (c *Client) WriteFile(ctx context.Context, path string, mode os.FileMode, r io.Reader) (wire.FileInfo, error) {
	if r == nil {
		r = http.NoBody
	}
	q := url.Values{"path": {path}, "mode": {"0" + strconv.FormatUint(uint64(fileModeBits(mode)), 8)}}
	var info wire.FileInfo
	if err := c.call(ctx, "writing "+path, http.MethodPut, "/files", q, streamBody{r}, &info); err != nil {
		return wire.FileInfo{}, err
	}
	return info, nil
}

// Stat describes path without following a final symbolic link.
func (c *Client) Stat(ctx context.Context, path string) (wire.FileInfo, error) {
	var info wire.FileInfo
	if err := c.call(ctx, "stat "+path, http.MethodGet, "/files/stat", url.Values{"path": {path}}, nil, &info); err != nil {
		return wire.FileInfo{}, err
	}
	return info, nil
}

// List returns the entries of the directory path, sorted by name.
func (c *Client) List(ctx context.Context, path string) ([]wire.FileInfo, error) {
	var infos []wire.FileInfo
	if err := c.call(ctx, "listing "+path, http.MethodGet, "/files/list", url.Values{"path": {path}}, nil, &infos); err != nil {
		return nil, err
	}
	return infos, nil
}

// Mkdir creates a directory as req describes and returns its info.
func (c *Client) Mkdir(ctx context.Context, req wire.MkdirRequest) (wire.FileInfo, error) {
	var info wire.FileInfo
	if err := c.call(ctx, "creating directory "+req.Path, http.MethodPost, "/files/mkdir", nil, req, &info); err != nil {
		return wire.FileInfo{}, err
	}
	return info, nil
}

// Remove removes path; a non-empty directory needs recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}, "recursive": {strconv.FormatBool(recursive)}}
	return c.call(ctx, "removing "+path, http.MethodDelete, "/files", q, nil, nil)
}

// Rename moves from to to inside the sandbox and returns the info of to.
func (c *Client) Rename(ctx context.Context, from, to string) (wire.FileInfo, error) {
	var info wire.FileInfo
	action := "renaming " + from + " to " + to
	if err := c.call(ctx, action, http.MethodPost, "/files/rename", nil, wire.RenameRequest{From: from, To: to}, &info); err != nil {
		return wire.FileInfo{}, err
	}
	return info, nil
}

// streamBody marks a request body that is streamed as it is, not encoded.
type streamBody struct{ r io.Reader }

// call does one request whose answer is JSON (decoded into out unless out
// is nil) or an error body. in is nil, a streamBody, or a value sent as
// JSON. Errors of the agent come back as it sent them, which already say
// what failed; other errors are wrapped with action.
func (c *Client) call(ctx context.Context, action, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	contentType := ""
	switch v := in.(type) {
	case nil:
	case streamBody:
		body, contentType = v.r, "application/octet-stream"
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: encoding request: %w", action, err)
		}
		body, contentType = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, q, contentType, body)
	if err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return wire.DecodeError(resp)
	}
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSONResponse)).Decode(out); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return fmt.Errorf("%s: %w", action, ctxErr)
			}
			return &unavailableError{fmt.Errorf("%s: reading agent response: %w", action, err)}
		}
	}
	// Reading to the end lets the connection be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// do sends one request. Transport failures come back as ctx.Err() when ctx
// ended, else wrapped in ErrUnavailable.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, contentType string, body io.Reader) (*http.Response, error) {
	u := baseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "building request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err == nil {
		return resp, nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // drop the placeholder URL from the message
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return nil, ctxErr
	}
	var unavailable *unavailableError
	if errors.As(err, &unavailable) {
		return nil, err
	}
	return nil, &unavailableError{err}
}

// unavailableError marks a transport failure as errdefs.ErrUnavailable and
// keeps its cause, without changing the message.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string   { return e.err.Error() }
func (e *unavailableError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.err} }

// fileModeBits converts an os.FileMode to unix permission bits, including
// setuid, setgid and sticky.
func fileModeBits(m os.FileMode) uint32 {
	bits := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		bits |= 0o1000
	}
	return bits
}
