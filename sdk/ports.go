package corral

import (
	"net/http"
	"net/url"
	"strconv"
)

// PortURL returns the URL at which the daemon forwards HTTP (and
// WebSocket upgrades) to TCP port of sandbox id; append the path to it.
// Over a unix socket the URL's host is a placeholder: send requests with
// PortClient. The sandbox must be running; the daemon connects to
// 127.0.0.1:port inside it, in any network mode.
func (c *Client) PortURL(id string, port int) string {
	return c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/"
}

// PortClient returns an HTTP client for PortURLs: it reaches the daemon
// the way c does (over its unix socket or TCP) and sends the API key as
// X-API-Key, which the daemon removes, so the request's own Authorization
// header reaches the sandbox's server untouched. Use it as the HTTPClient
// of a WebSocket dialer too.
func (c *Client) PortClient() *http.Client {
	return &http.Client{Transport: keyTransport{key: c.apiKey, next: c.hc.Transport}}
}

// keyTransport adds the API key to every request.
type keyTransport struct {
	key  string
	next http.RoundTripper
}

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.key == "" {
		return t.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", t.key)
	return t.next.RoundTrip(r)
}
