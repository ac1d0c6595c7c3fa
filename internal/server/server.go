package server

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/codeclient"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/templates"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// OpenAPI is the API description served at /v1/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Config wires a Server.
type Config struct {
	Manager *sandbox.Manager
	// Version and Storage are reported by /v1/version.
	Version string
	Storage string
	// Images, when set, serves template pulls, image imports and
	// Dockerfile builds (templates.go).
	Images *templates.Service
	// Metrics is served at /metrics (empty when nil); pass the registry
	// the Manager registered on.
	Metrics *metrics.Registry
	// Keys, when set, are the API keys TCP listeners accept (AuthHandler);
	// without it they accept the one key AuthHandler is given.
	Keys *tenancy.Keys
	// Secrets, when set, serves /v1/secrets: each tenant's secrets for
	// its sandboxes' egress, managed by the tenant's own keys.
	Secrets *secrets.Store
	// Audit, when set, records every call that changes something, before
	// it runs, with its outcome, and code run in sandboxes; GET /v1/audit
	// reads it.
	Audit *audit.Log
	// Nodes, when set, serves GET /v1/nodes: the daemon is in a cluster.
	Nodes  NodeLister
	Logger *slog.Logger
}

// Server serves the /v1 API for one Manager.
type Server struct {
	m   *sandbox.Manager
	cfg Config
	log *slog.Logger
	mux *http.ServeMux
	reg *metrics.Registry
	// ports forwards /v1/sandboxes/{id}/ports/{port}/ (ports.go).
	ports *PortProxy
	// code talks to the code interpreters of sandboxes (code.go).
	code *codeclient.Client
}

// New returns a Server with every route registered.
func New(cfg Config) *Server {
	s := &Server{m: cfg.Manager, cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.ports = NewPortProxy(cfg.Manager, func(w http.ResponseWriter, r *http.Request, err error) { s.writeError(w, r, err) })
	s.code = codeclient.New(cfg.Manager.DialPort)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.reg = cfg.Metrics; s.reg == nil {
		s.reg = metrics.NewRegistry()
	}
	calls := CallAudit{Log: cfg.Audit, Logger: s.log, Fail: s.writeError}
	for _, r := range s.routes() {
		h := calls.Wrap(r.pattern, callRecord(r.pattern), r.handler)
		if sessionRoutes[r.pattern] {
			h = calls.Record(callRecord(r.pattern), r.handler)
		}
		if adminRoutes[r.pattern] {
			h = adminOnly(s, h)
		}
		s.mux.HandleFunc(r.pattern, h)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return s
}

// sessionRoutes change something though their method is GET: an attach
// session writes stdin, resizes the terminal and sends signals. The audit
// log records each session, as it starts and as it ends.
var sessionRoutes = map[string]bool{"GET /v1/sandboxes/{id}/processes/{pid}/attach": true}

type route struct {
	pattern string
	handler http.HandlerFunc
}

// routes lists every endpoint; a test checks it against the OpenAPI file.
func (s *Server) routes() []route {
	return append([]route{
		{"GET /v1/health", s.health},
		{"GET /v1/version", s.version},
		{"GET /v1/openapi.json", s.openapi},
		{"GET /v1/runtimes", s.runtimes},
		{"POST /v1/sandboxes", s.createSandbox},
		{"POST /v1/run", s.run},
		{"GET /v1/sandboxes", s.listSandboxes},
		{"GET /v1/sandboxes/{id}", s.getSandbox},
		{"DELETE /v1/sandboxes/{id}", s.deleteSandbox},
		{"POST /v1/sandboxes/{id}/timeout", s.setTimeout},
		{"PATCH /v1/sandboxes/{id}", s.updateSandbox},
		{"PUT /v1/sandboxes/{id}/network", s.updateNetwork},
		{"GET /v1/sandboxes/{id}/stats", s.stats},
		{"GET /v1/sandboxes/{id}/mounts/changes", s.mountChanges},
		{"POST /v1/sandboxes/{id}/exec", s.exec},
		{"GET /v1/sandboxes/{id}/files", s.readFile},
		{"PUT /v1/sandboxes/{id}/files", s.writeFile},
		{"DELETE /v1/sandboxes/{id}/files", s.removeFile},
		{"GET /v1/sandboxes/{id}/files/stat", s.statFile},
		{"GET /v1/sandboxes/{id}/files/list", s.listFiles},
		{"POST /v1/sandboxes/{id}/files/mkdir", s.mkdir},
		{"POST /v1/sandboxes/{id}/files/rename", s.rename},
		{"GET /v1/sandboxes/{id}/files/archive", s.readArchive},
		{"PUT /v1/sandboxes/{id}/files/archive", s.writeArchive},
		{"GET /v1/sandboxes/{id}/files/watch", s.watch},
		{"POST /v1/sandboxes/{id}/processes", s.startProcess},
		{"GET /v1/sandboxes/{id}/processes", s.listProcesses},
		{"GET /v1/sandboxes/{id}/processes/{pid}", s.getProcess},
		{"DELETE /v1/sandboxes/{id}/processes/{pid}", s.removeProcess},
		{"GET /v1/sandboxes/{id}/processes/{pid}/output", s.processOutput},
		{"POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.writeStdin},
		{"DELETE /v1/sandboxes/{id}/processes/{pid}/stdin", s.closeStdin},
		{"POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signalProcess},
		{"POST /v1/sandboxes/{id}/processes/{pid}/resize", s.resizeProcess},
		{"GET /v1/sandboxes/{id}/processes/{pid}/wait", s.waitProcess},
		{"GET /v1/sandboxes/{id}/processes/{pid}/attach", s.attachProcess},
		{"GET /v1/templates", s.listTemplates},
		{"GET /v1/templates/{name}", s.getTemplate},
		{"PUT /v1/templates/{name}", s.importTemplate},
		{"POST /v1/templates/{name}/build", s.buildTemplate},
		{"POST /v1/templates/{name}/pull", s.pullTemplate},
		{"DELETE /v1/templates/{name}", s.deleteTemplate},
		{"GET /v1/events", s.events},
		{"GET /metrics", s.metrics},
		{"GET /v1/pools", s.listPools},
		{"GET /v1/pools/{name}", s.getPool},
		{"PUT /v1/pools/{name}", s.setPool},
		{"DELETE /v1/pools/{name}", s.deletePool},
		{"GET /v1/nodes", s.listNodes},
	}, slices.Concat(s.portRoutes(), s.snapshotRoutes(), s.stopStartRoutes(), s.volumeRoutes(),
		s.serviceRoutes(), s.readyRoutes(), s.codeRoutes(), s.keyRoutes(), s.secretRoutes(), []route{{"GET /v1/audit", s.auditLog}})...)
}

// Handler returns the API handler without authentication (for the
// root-only unix socket): its callers are the operator, an admin, and
// share one principal for per-principal limits.
func (s *Server) Handler() http.Handler { return s.withOperator(s.mux) }

// AuthHandler returns the API handler requiring an API key as a bearer
// token or an X-API-Key header (for TCP listeners): Config.Keys, or
// apiKey alone when the server has no key records. The key's principal
// (tenant, admin, quotas) travels in the request's context. An empty
// apiKey without records is refused: the daemon must not expose an
// unauthenticated TCP API.
func (s *Server) AuthHandler(apiKey string) (http.Handler, error) {
	keys, err := s.keys(apiKey)
	if err != nil {
		return nil, err
	}
	return s.requireKey(keys, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The key goes no further: a request forwarded to a sandbox's
		// port must not carry it in.
		key := RequestKey(r.Header)
		r.Header.Del("X-API-Key")
		if bearer, _ := Credentials(r.Header, "Bearer"); bearer == key {
			r.Header.Del("Authorization")
		}
		s.mux.ServeHTTP(w, r)
	})), nil
}

// KeyHandler returns h behind the API key as AuthHandler checks it, with
// the key left in the request, for a handler that calls the API itself
// with its caller's key (the MCP endpoint). Refusals have the API's error
// shape.
func (s *Server) KeyHandler(apiKey string, h http.Handler) (http.Handler, error) {
	keys, err := s.keys(apiKey)
	if err != nil {
		return nil, err
	}
	return s.requireKey(keys, h), nil
}

// keys returns the key records to authenticate with.
func (s *Server) keys(apiKey string) (*tenancy.Keys, error) {
	if s.cfg.Keys != nil {
		return s.cfg.Keys, nil
	}
	if apiKey == "" {
		return nil, errors.New("an API key is required to serve the API over TCP")
	}
	return tenancy.NewKeys(context.Background(), tenancy.NewMemStore(), apiKey)
}

// RequestKey returns the API key a request carries: its X-API-Key header,
// else its bearer token.
func RequestKey(h http.Header) string {
	if k := h.Get("X-API-Key"); k != "" {
		return k
	}
	bearer, _ := Credentials(h, "Bearer")
	return bearer
}

// Credentials returns the credentials of the request's Authorization
// header when its scheme is scheme ("Bearer", "Basic"), which is matched
// regardless of case: "It uses a case-insensitive token to identify the
// authentication scheme" (RFC 9110 §11.1), and "credentials = auth-scheme
// [ 1*SP ( token68 / #auth-param ) ]" (§11.4).
func Credentials(h http.Header, scheme string) (string, bool) {
	got, creds, ok := strings.Cut(h.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(got, scheme) {
		return "", false
	}
	return strings.TrimLeft(creds, " "), true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body strictly: unknown fields and trailing data are
// errors, so a typo in a field name is reported instead of ignored.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "request body is empty; expected JSON")
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON body: %v", err)
	}
	if dec.More() {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON body: trailing data")
	}
	return nil
}

// health answers 200 while the daemon serves requests; the body says
// whether anything it promises is currently not kept.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	h := Health{OK: true}
	if q, ok := s.m.DiskQuota(); ok {
		h.DiskQuota = &q
		if q.Enabled && !q.Consistent {
			h.OK = false
			h.Problems = append(h.Problems, "disk quota accounting is inconsistent: disk limits are not enforced and creates with a disk limit are refused until it is repaired")
		}
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, VersionInfo{Version: s.cfg.Version, Storage: s.cfg.Storage, Runtimes: s.m.Runtimes()})
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(OpenAPI)
}

func (s *Server) runtimes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.m.Runtimes())
}

// writeError answers r with err as a client may see it (clientError).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	wire.WriteError(w, s.clientError(r, err))
}

// clientError is what the client of r may be told of err
// (wire.ClientError).
func (s *Server) clientError(r *http.Request, err error) error {
	return wire.ClientError(s.log, r, r.PathValue("id"), err)
}

// redactor returns clientError for the client of r, for streams that
// report errors after their status line.
func (s *Server) redactor(r *http.Request) func(error) error {
	return func(err error) error { return s.clientError(r, err) }
}

// errorOf is the error detail of an error event.
func errorOf(err error) *wire.ErrorDetail {
	return &wire.ErrorDetail{Code: errdefs.Code(err), Message: err.Error()}
}
