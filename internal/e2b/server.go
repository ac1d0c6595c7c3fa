package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"github.com/corralrun/corral/internal/egress"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// envdPort is the port of E2B's in-sandbox agent; the SDK names it in the
// E2b-Sandbox-Port header and in sandbox host names (49983-<id>.<domain>).
const envdPort = "49983"

// envdVersion is the envd version Corral reports. The SDKs compare it to
// decide which features they may use: 0.6.4 enables everything this
// facade implements (stdin close, octet-stream uploads, recursive watches,
// watch events with entries); newer features stay disabled client-side.
const envdVersion = "0.6.4"

// Config wires a Server.
type Config struct {
	// Manager runs the sandboxes; required.
	Manager *sandbox.Manager
	// APIKey is the daemon's API key: the SDK sends it as X-API-Key (from
	// E2B_API_KEY), and it also keys the per-sandbox access tokens.
	// Required: with none, every request is refused.
	APIKey string
	// Keys, when set, are the API keys the control plane accepts, each a
	// team that sees its own sandboxes only (APIKey is one of them).
	Keys *tenancy.Keys
	// Domain, when set, is returned as each sandbox's domain, so that an
	// SDK without E2B_SANDBOX_URL reaches envd at
	// https://49983-<id>.<Domain> (a TLS proxy with a wildcard name in
	// front of the daemon). Empty returns no domain.
	Domain string
	// Logger receives request-level logs; nil discards them.
	Logger *slog.Logger
	// Volumes serves E2B's volumes; nil uses the Manager's volume API
	// when it has one. Without either, volume calls answer 501 and
	// volumeMounts are refused.
	Volumes VolumeManager
	// Templates builds the templates of E2B's template-build API
	// (Template.build); nil answers those calls 501.
	Templates TemplateBuilder
	// BuildDir keeps the files that template builds upload and the table
	// of template tags; required with Templates.
	BuildDir string
	// BuildNetwork is what the RUN steps of those builds may reach; the
	// zero value is nothing (loopback only).
	BuildNetwork egress.Policy
	// MaxUploadBytes bounds one upload of a template build's files, as
	// sent and unpacked; 0 means 4 GiB.
	MaxUploadBytes int64
	// Audit, when set, records every control-plane and volume content
	// call that changes something, before it runs, with its outcome
	// (server.CallAudit); commands started through envd are recorded by
	// the Manager.
	Audit *audit.Log
}

// Server serves E2B's control-plane API and envd API for one Manager. It
// is safe for concurrent use. Close ends its streams and polling watchers.
type Server struct {
	cfg      Config
	m        *sandbox.Manager
	vols     VolumeManager  // nil: no volumes (volumes.go)
	content  *http.ServeMux // the volume content API (volumecontent.go)
	log      *slog.Logger
	control  *http.ServeMux
	calls    server.CallAudit
	rpcs     rpcs
	watchers *watcherSet
	ports    *server.PortProxy // sandbox ports other than envd's (ports.go)

	tags      *tagTable // nil: no template builds (templatetags.go)
	builds    builds
	swept     chan struct{} // closed when sweepOrphans returns; nil without it
	closing   chan struct{} // closed by Close: streams end
	closeOnce sync.Once
}

// New returns a Server with every route registered. It starts nothing:
// goroutines exist only while requests or polling watchers do.
func New(cfg Config) (*Server, error) {
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = 4 << 30
	}
	s := &Server{cfg: cfg, m: cfg.Manager, vols: volumeManagerOf(cfg), log: cfg.Logger,
		control: http.NewServeMux(), content: http.NewServeMux(), closing: make(chan struct{}),
		builds: builds{m: map[string]*build{}}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Templates != nil {
		if cfg.BuildDir == "" {
			return nil, errors.New("e2b: template builds need a BuildDir")
		}
		tags, err := openTags(filepath.Join(cfg.BuildDir, "tags.json"))
		if err != nil {
			return nil, err
		}
		s.tags = tags
		// Uploads a crash interrupted.
		if err := os.RemoveAll(s.stagingDir()); err != nil {
			return nil, err
		}
	}
	s.calls = server.CallAudit{Log: cfg.Audit, Logger: s.log, Fail: s.writeAPIError}
	s.watchers = newWatcherSet(s)
	s.ports = server.NewPortProxy(cfg.Manager, s.writeAPIError)
	s.routeControl()
	s.routeVolumeContent()
	s.rpcs = s.newRPCs()
	if s.tags != nil {
		s.swept = make(chan struct{})
		go s.sweepOrphans()
	}
	return s, nil
}

// Close ends every streaming call in flight (their clients see the stream
// end with "unavailable"; the processes they follow keep running), stops
// the polling watchers and waits for their goroutines. Call it before
// shutting the HTTP server down, which would otherwise wait for streams
// that never end. Later calls are no-ops.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	if s.swept != nil {
		<-s.swept
	}
	s.watchers.close()
	s.ports.CloseIdle()
	return nil
}

// Handler returns the handler of every surface. A request that names a
// sandbox (E2b-Sandbox-Id, or a 49983-<id>.<domain> host) goes to envd;
// one under /volumecontent/ to the volume content API; any other to the
// control plane. Point E2B_API_URL, E2B_SANDBOX_URL and
// E2B_VOLUME_API_URL at the same listener.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.APIKey == "" {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "the E2B API is disabled: the daemon has no API key"))
			return
		}
		if id, port := sandboxOf(r); id != "" {
			s.serveEnvd(w, r, id, port)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/volumecontent/") || strings.HasPrefix(r.URL.Path, "/templatefiles/") {
			s.content.ServeHTTP(w, r) // authenticated per volume, or by the upload URL's signature
			return
		}
		if isRPCPath(r.URL.Path) {
			s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"no sandbox named: envd requests need the E2b-Sandbox-Id header (set E2B_SANDBOX_URL to this server)"))
			return
		}
		r, stop, ok := s.caller(r)
		defer stop()
		if !ok {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or invalid API key: send the daemon's API key as X-API-Key (E2B_API_KEY)"))
			return
		}
		s.control.ServeHTTP(w, r)
	})
}

// sandboxOf returns the sandbox and port a request addresses: from the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers, or from a host name
// <port>-<id>.<domain> as E2B's proxy reads it.
func sandboxOf(r *http.Request) (id, port string) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := r.Header.Get("E2b-Sandbox-Port")
		if port == "" {
			port = envdPort
		}
		return id, port
	}
	host, _, _ := strings.Cut(r.Host, ".")
	if p, id, ok := strings.Cut(host, "-"); ok && id != "" && p != "" && strings.Trim(p, "0123456789") == "" && strings.Contains(r.Host, ".") {
		return id, p
	}
	return "", ""
}

func isRPCPath(p string) bool {
	return strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request, id, port string) {
	rpc := isRPCPath(r.URL.Path)
	fail := func(w http.ResponseWriter, r *http.Request, err error) {
		if rpc {
			s.writeRPCError(w, r, err)
			return
		}
		s.writeAPIError(w, r, err)
	}
	if port != envdPort {
		s.servePort(w, r, id, port)
		return
	}
	// /files also accepts a signed URL (downloadUrl/uploadUrl); it checks
	// the signature itself.
	r, stop, ok := s.envdAuth(r, id)
	defer stop()
	if !ok && !(r.URL.Path == "/files" && r.URL.Query().Get("signature") != "") {
		fail(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or invalid access token for sandbox %s: send X-Access-Token as returned at creation", id))
		return
	}
	h := func(w http.ResponseWriter, r *http.Request) {
		switch {
		case rpc:
			s.serveRPC(w, r, id)
		case r.URL.Path == "/files":
			s.files(w, r, id)
		case r.URL.Path == "/health":
			s.envdHealth(w, r, id)
		case r.URL.Path == "/envs" && r.Method == http.MethodGet:
			s.envs(w, r, id)
		default:
			fail(w, r, errdefs.Errorf(errdefs.ErrNotFound, "envd route %s %s is not implemented by Corral", r.Method, r.URL.Path))
		}
	}
	if envdChanges[r.URL.Path] || (r.URL.Path == "/files" && r.Method == http.MethodPost) {
		calls := s.calls
		calls.Fail = fail
		h = calls.Record(func(r *http.Request) audit.Record {
			return sandbox.AuditRecord(r.Context(), r.Method+" "+r.URL.Path, id)
		}, h)
	}
	h(w, r)
}

// envdChanges are the envd calls that change something other than by
// starting a command, which the Manager records itself: they are on the
// audit log, as are uploads (POST /files).
var envdChanges = map[string]bool{
	"/process.Process/SendInput":     true,
	"/process.Process/StreamInput":   true,
	"/process.Process/SendSignal":    true,
	"/process.Process/CloseStdin":    true,
	"/process.Process/Update":        true,
	"/filesystem.Filesystem/MakeDir": true,
	"/filesystem.Filesystem/Move":    true,
	"/filesystem.Filesystem/Remove":  true,
}

// envdHealth answers 204 while the sandbox runs and 502 otherwise, which
// is how the SDK's isRunning tells a live sandbox from a gone one.
func (s *Server) envdHealth(w http.ResponseWriter, r *http.Request, id string) {
	if _, err := s.agent(id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// envs answers envd's GET /envs: the sandbox's environment variables.
func (s *Server) envs(w http.ResponseWriter, r *http.Request, id string) {
	if _, err := s.agent(id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	sb, err := s.m.Get(r.Context(), id)
	if err != nil {
		s.writeAPIError(w, r, unavailable("%v", err))
		return
	}
	env := sb.Env
	if env == nil {
		env = map[string]string{}
	}
	writeJSON(w, http.StatusOK, env)
}

// agent returns the agent client of a running sandbox. A sandbox that is
// gone or not running is "unavailable" (HTTP 502 on envd routes), as
// E2B's proxy answers for a killed sandbox; the SDK then reports that the
// sandbox was killed or timed out, rather than that a file is missing.
func (s *Server) agent(id string) (*agentclient.Client, error) {
	c, err := s.m.Agent(context.Background(), id)
	if err != nil {
		return nil, unavailable("%v", err)
	}
	return c, nil
}

// unavailable returns an error of kind ErrUnavailable.
func unavailable(format string, args ...any) error {
	return errdefs.Errorf(errdefs.ErrUnavailable, format, args...)
}

// accessToken is the envd access token of sandbox id: an HMAC of the ID
// under the API key, so it needs no storage, survives daemon restarts and
// changes when the key does.
func (s *Server) accessToken(id string) string {
	mac := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	mac.Write([]byte("corral-e2b-envd-token\x00" + id))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// key returns the principal of the API key a request carries (X-API-Key,
// or a bearer token) and the key; ok is false without a valid one.
// Without Config.Keys the daemon's one key is the only key, an admin.
func (s *Server) key(r *http.Request) (p tenancy.Principal, key string, ok bool) {
	got := r.Header.Get("X-API-Key")
	if got == "" {
		got, _ = server.Credentials(r.Header, "Bearer")
	}
	switch {
	case got == "":
		return p, "", false
	case s.cfg.Keys != nil:
		var err error
		if p, err = s.cfg.Keys.Authenticate(got); err != nil {
			return p, "", false
		}
	case subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) == 1:
		p = tenancy.Principal{Key: tenancy.BootstrapName, Admin: true}
	default:
		return p, "", false
	}
	return p, got, true
}

// caller authenticates the API key a request carries and returns the
// request with the key's principal in its context: a key is a team, and
// sees its tenant's sandboxes only. That context ends when the key is
// deleted or rotated, so that the request's streams and proxied
// connections end with it; stop ends the watch and must be called once
// the request is done (it is a no-op when ok is false).
func (s *Server) caller(r *http.Request) (_ *http.Request, stop func(), ok bool) {
	p, key, ok := s.key(r)
	if !ok {
		return r, func() {}, false
	}
	principal := admission.APIKeyPrincipal(key)
	if p.Key != tenancy.BootstrapName {
		principal = "key:" + p.Key
	}
	ctx, stop := tenancy.With(r.Context(), p), func() {}
	if s.cfg.Keys != nil {
		ctx, stop = s.cfg.Keys.Watch(ctx, key)
	}
	ctx = admission.WithPrincipal(ctx, principal)
	return r.WithContext(ctx), stop, true
}

// envdAuth authenticates a request for sandbox id's envd: with the
// sandbox's access token, or an API key whose tenant owns it. It returns
// the request with its caller's principal in its context, so that the
// commands it starts are on record under a key: an API key's own, or, for
// the access token, the sandbox's tenant and the key that created it
// (not an admin: the token reaches this sandbox only). A request with an
// API key ends when the key is revoked (caller); one with the access
// token does not, as the token is the sandbox's, not the key's. stop is
// caller's.
func (s *Server) envdAuth(r *http.Request, id string) (_ *http.Request, stop func(), ok bool) {
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.accessToken(id))) != 1 {
			return r, func() {}, false
		}
		if sb, err := s.m.Get(r.Context(), id); err == nil {
			r = r.WithContext(tenancy.With(r.Context(), tenancy.Principal{Tenant: sb.Tenant, Key: sb.Key}))
		}
		return r, func() {}, true
	}
	r, stop, ok = s.caller(r)
	if !ok {
		return r, stop, false
	}
	if _, err := s.m.Get(r.Context(), id); err != nil {
		stop()
		return r, func() {}, false
	}
	return r, stop, true
}

// apiError is E2B's error body: {"code": <HTTP status>, "message": "..."}.
// The SDKs read code to tell "not found" (404) and "already paused" (409)
// from other failures.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeAPIError writes err, as the client of r may see it (redact), in
// E2B's REST error shape. Unavailable becomes 502, which is what E2B
// answers for a sandbox that is gone.
func (s *Server) writeAPIError(w http.ResponseWriter, r *http.Request, err error) {
	err = s.redact(r, err)
	e := apiErrorOf(err)
	wire.SetRetryAfter(w, err)
	writeJSON(w, e.Code, e)
}

// redact is what the client of r may be told of err (wire.ClientError).
func (s *Server) redact(r *http.Request, err error) error {
	id, _ := sandboxOf(r)
	if id == "" {
		id = r.PathValue("id")
	}
	return wire.ClientError(s.log, r, id, err)
}

// apiErrorOf is err in E2B's REST error shape (see writeAPIError).
func apiErrorOf(err error) apiError {
	status := wire.HTTPStatus(errdefs.Code(err))
	switch {
	case errors.Is(err, errdefs.ErrUnavailable):
		status = http.StatusBadGateway
	case errors.Is(err, context.DeadlineExceeded):
		status = http.StatusGatewayTimeout
	}
	return apiError{Code: status, Message: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// admin refuses h to keys that are not admin keys: the templates of the
// template-build API and their tags are shared by every team, so only
// admins build and tag them. A team makes its own templates through
// Corral's API.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p, ok := tenancy.From(r.Context()); ok && !p.Admin {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrPermissionDenied, "the template-build API's templates and tags are shared by every team: only admin keys build or tag them (a team makes its own templates through Corral's API)"))
			return
		}
		h(w, r)
	}
}

// handle registers h for pattern on the control plane, recording the
// calls that change something in the audit log (server.CallAudit).
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.control.HandleFunc(pattern, s.calls.Wrap(pattern, callRecord(pattern), h))
}

// callRecord returns the record of a call of route pattern: its caller,
// the sandbox of a /sandboxes/{id} route, and the route's other names
// (a template's ID, a build, a volume).
func callRecord(pattern string) func(*http.Request) audit.Record {
	sandboxRoute := strings.Contains(pattern, "/sandboxes/{id}")
	return func(r *http.Request) audit.Record {
		var id string
		if sandboxRoute {
			id = r.PathValue("id")
		}
		rec := sandbox.AuditRecord(r.Context(), pattern, id)
		for _, name := range []string{"id", "build", "volumeID"} {
			if v := r.PathValue(name); v != "" && !(name == "id" && sandboxRoute) {
				if rec.Detail == nil {
					rec.Detail = map[string]string{}
				}
				rec.Detail[name] = v
			}
		}
		return rec
	}
}
