// Package corral is the Go client of Corral's REST API.
//
// It imports nothing from Corral's internal packages, so programs can
// depend on it alone. A Client is safe for concurrent use.
//
//	c, err := corral.FromEnv() // CORRAL_HOST, CORRAL_API_KEY
//	sb, err := c.Create(ctx, corral.CreateOptions{Template: "default"})
//	res, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"python3", "-c", "print(6*7)"}, Stdout: os.Stdout})
//	err = c.Delete(ctx, sb.ID)
//
// Processes that outlive a call (StartProcess, Output, Attach, SendStdin,
// Signal, Wait) keep running when the client goes away and can be
// re-attached by PID; Upload, Download, UploadDir and DownloadDir move
// trees as tar streams, and Watch follows changes under a directory.
package corral

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
	"strings"
	"time"
)

// DefaultHost is where the daemon listens unless told otherwise.
const DefaultHost = "unix:///run/corral/corral.sock"

// Client talks to one Corral daemon.
type Client struct {
	base   string // scheme://host without trailing slash
	apiKey string
	hc     *http.Client
}

// New returns a client for host, which is "unix:///path/to.sock" or
// "http(s)://host:port". apiKey may be empty for the local unix socket.
func New(host, apiKey string) (*Client, error) {
	if host == "" {
		host = DefaultHost
	}
	c := &Client{apiKey: apiKey}
	switch {
	case strings.HasPrefix(host, "unix://"):
		path := strings.TrimPrefix(host, "unix://")
		if path == "" {
			return nil, fmt.Errorf("corral host %q has no socket path", host)
		}
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
			MaxIdleConnsPerHost: 16,
		}
		c.base = "http://corral"
		c.hc = &http.Client{Transport: tr}
	case strings.HasPrefix(host, "http://"), strings.HasPrefix(host, "https://"):
		u, err := url.Parse(host)
		if err != nil {
			return nil, fmt.Errorf("parsing corral host %q: %w", host, err)
		}
		c.base = strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/")
		// A host that does not answer fails after dialTimeout rather than
		// the system's TCP timeout (minutes).
		dialer := &net.Dialer{Timeout: dialTimeout}
		c.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, Proxy: http.ProxyFromEnvironment,
			DialContext: dialer.DialContext}}
	default:
		return nil, fmt.Errorf("corral host %q must start with unix://, http:// or https://", host)
	}
	return c, nil
}

// dialTimeout bounds connecting to a daemon over TCP.
const dialTimeout = 30 * time.Second

// NewWithTransport is New for an "http(s)://host:port" daemon reached
// through rt instead of a transport of the client's own: for a program
// that must choose its proxy, TLS or dialing (the daemon's MCP endpoint
// reaching its own API takes no proxy). The client's Close closes rt's
// idle connections when rt has a CloseIdleConnections method.
func NewWithTransport(host, apiKey string, rt http.RoundTripper) (*Client, error) {
	if !strings.HasPrefix(host, "http://") && !strings.HasPrefix(host, "https://") {
		return nil, fmt.Errorf("corral host %q must start with http:// or https://", host)
	}
	c, err := New(host, apiKey)
	if err != nil {
		return nil, err
	}
	c.hc = &http.Client{Transport: rt}
	return c, nil
}

// FromEnv returns a client for CORRAL_HOST (default DefaultHost) with the
// key in CORRAL_API_KEY.
func FromEnv() (*Client, error) {
	return New(os.Getenv("CORRAL_HOST"), os.Getenv("CORRAL_API_KEY"))
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Error is an error answered by the daemon.
type Error struct {
	Status  int    // HTTP status
	Code    string // machine-readable code, e.g. "not_found"
	Message string
	// RetryAfter is when the same request may succeed, from the
	// Retry-After header: set on admission refusals (CodeBusy, 503: the
	// server is at capacity; CodeResourceExhausted, 429: the API key's
	// limit), 0 otherwise.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message + " (" + e.Code + ")" }

// Error codes the daemon answers with.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeFailedPrecondition = "failed_precondition"
	CodeResourceExhausted  = "resource_exhausted"
	CodeBusy               = "busy"
	CodeUnavailable        = "unavailable"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotImplemented     = "not_implemented"
	CodeInternal           = "internal"
)

// ErrorCode returns the daemon's error code in err, or "" if err is not an
// *Error.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeError(resp *http.Response) error {
	var body errorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err := json.Unmarshal(data, &body); err != nil || body.Error.Code == "" {
		msg := strings.TrimSpace(string(data))
		if msg == "" {
			msg = resp.Status
		}
		return &Error{Status: resp.StatusCode, Code: codeForStatus(resp.StatusCode), Message: msg, RetryAfter: retryAfter(resp)}
	}
	return &Error{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message, RetryAfter: retryAfter(resp)}
}

// retryAfter reads a Retry-After header in seconds (the daemon does not
// send the HTTP-date form).
func retryAfter(resp *http.Response) time.Duration {
	n, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// RetryAfter returns how long to wait before repeating a request the
// daemon refused for capacity or a limit, and whether err is such a
// refusal.
func RetryAfter(err error) (time.Duration, bool) {
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return 0, false
}

// codeForStatus names the error of a response that carried no error body
// (a proxy's answer, say) after its HTTP status.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeFailedPrecondition
	case http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return CodeUnavailable
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotImplemented:
		return CodeNotImplemented
	default:
		return CodeInternal
	}
}

// do sends a request and returns the response when its status is 2xx; the
// caller closes the body. Other statuses become *Error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("corral daemon unreachable: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// doJSON sends in (if non-nil) as JSON and decodes the response into out
// (if non-nil).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, query, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding response of %s %s: %w", method, path, err)
	}
	return nil
}
