package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/codeclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// portMethods are the methods /v1/sandboxes/{id}/ports/{port}/ forwards;
// GET covers HEAD and WebSocket upgrades.
var portMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// PortProxy forwards HTTP requests, WebSocket upgrades included, to a
// port of a running sandbox (sandbox.Manager.DialPort). It holds one
// transport for every sandbox: the URL host of an outgoing request is
// "<id>:<port>", which its dialer turns back into a DialPort call, so
// idle connections are kept per sandbox port. Safe for concurrent use.
type PortProxy struct {
	m  *sandbox.Manager
	rp *httputil.ReverseProxy
	tr *http.Transport
	// writeError answers a request that could not be forwarded.
	writeError func(http.ResponseWriter, *http.Request, error)
}

// NewPortProxy returns a PortProxy for m's sandboxes that answers failures
// with writeError, which decides what the client may see of them
// (wire.Redact).
func NewPortProxy(m *sandbox.Manager, writeError func(http.ResponseWriter, *http.Request, error)) *PortProxy {
	tr := &http.Transport{
		DialContext:         codeclient.AddrDialer(m.DialPort),
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	p := &PortProxy{m: m, writeError: writeError, tr: tr}
	p.rp = &httputil.ReverseProxy{
		Transport: tr,
		// Forward puts each request's target in its context.
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(portTargetKey{}).(portTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.id + ":" + strconv.Itoa(t.port)
			pr.Out.URL.Path, pr.Out.URL.RawPath = t.path, t.rawPath
			// Servers that check Host (dev servers) accept localhost; the
			// client's host and the prefix travel as X-Forwarded-*.
			pr.Out.Host = "localhost:" + strconv.Itoa(t.port)
			pr.SetXForwarded()
			if t.prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errdefs.Code(err) == errdefs.CodeInternal {
				t := r.Context().Value(portTargetKey{}).(portTarget)
				err = fmt.Errorf("forwarding to port %d of sandbox %s: %w", t.port, t.id, errors.Join(errdefs.ErrUnavailable, err))
			}
			p.writeError(w, r, err)
		},
	}
	return p
}

// CloseIdle closes the idle connections to sandboxes (their goroutines
// end as well). Connections in use are not affected.
func (p *PortProxy) CloseIdle() { p.tr.CloseIdleConnections() }

type portTargetKey struct{}

// portTarget is where one forwarded request goes.
type portTarget struct {
	id            string
	port          int
	path, rawPath string
	prefix        string // the public path prefix, for X-Forwarded-Prefix
}

// Forward sends r to port of sandbox id with path rawPath (escaped, with
// its leading slash). prefix, if any, is the path the client used before
// rawPath. The sandbox must be running and something must listen on the
// port; errors are API errors (503 unavailable when nothing listens).
func (p *PortProxy) Forward(w http.ResponseWriter, r *http.Request, id string, port int, rawPath, prefix string) {
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		p.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "path %q: %v", rawPath, err))
		return
	}
	// Fail before proxying when the sandbox is not there, so that the
	// answer is a plain API error.
	if _, err := p.m.Get(r.Context(), id); err != nil {
		p.writeError(w, r, err)
		return
	}
	t := portTarget{id: id, port: port, path: path, prefix: prefix}
	if rawPath != path {
		t.rawPath = rawPath
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), portTargetKey{}, t)))
}

// forwardPort serves /v1/sandboxes/{id}/ports/{port}/{path...}.
func (s *Server) forwardPort(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || sandbox.RangePort.Check(int64(port)) != nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "port %q: want a number from %d to %d",
			r.PathValue("port"), sandbox.RangePort.Min, sandbox.RangePort.Max))
		return
	}
	prefix := "/v1/sandboxes/" + id + "/ports/" + r.PathValue("port")
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "path %q does not start with %q", r.URL.EscapedPath(), prefix))
		return
	}
	s.ports.Forward(w, r, id, port, rest, prefix)
}

// portRoutes are the routes of forwardPort, one per method.
func (s *Server) portRoutes() []route {
	var out []route
	for _, m := range portMethods {
		out = append(out, route{m + " /v1/sandboxes/{id}/ports/{port}/{path...}", s.forwardPort})
	}
	return out
}
