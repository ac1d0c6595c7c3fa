package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/corralrun/corral/internal/agent"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/images"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/template"
	"github.com/corralrun/corral/internal/untar"
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
	Images *images.Service
	// Metrics is served at /metrics (empty when nil); pass the registry
	// the Manager registered on.
	Metrics *metrics.Registry
	Logger  *slog.Logger
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
}

// New returns a Server with every route registered.
func New(cfg Config) *Server {
	s := &Server{m: cfg.Manager, cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.ports = NewPortProxy(cfg.Manager, func(w http.ResponseWriter, r *http.Request, err error) { s.writeError(w, r, err) })
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.reg = cfg.Metrics; s.reg == nil {
		s.reg = metrics.NewRegistry()
	}
	for _, r := range s.routes() {
		s.mux.HandleFunc(r.pattern, r.handler)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return s
}

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
	}, append(s.portRoutes(), s.snapshotRoutes()...)...)
}

// Handler returns the API handler without authentication (for the
// root-only unix socket, whose callers share one principal for
// per-principal limits).
func (s *Server) Handler() http.Handler { return withPrincipal(unixPrincipal, s.mux) }

// AuthHandler returns the API handler requiring apiKey as a bearer token or
// an X-API-Key header (for TCP listeners); the key is the principal of
// per-principal limits. An empty key is refused: the
// daemon must not expose an unauthenticated TCP API.
func (s *Server) AuthHandler(apiKey string) (http.Handler, error) {
	if apiKey == "" {
		return nil, errors.New("an API key is required to serve the API over TCP")
	}
	want := []byte(apiKey)
	h := withPrincipal(sandbox.APIKeyPrincipal(apiKey), s.mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("X-API-Key")
		bearer, _ := Credentials(r.Header, "Bearer")
		if got == "" {
			got = bearer
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or invalid API key (send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY')"))
			return
		}
		// The key goes no further: a request forwarded to a sandbox's
		// port must not carry it in.
		r.Header.Del("X-API-Key")
		if bearer == apiKey {
			r.Header.Del("Authorization")
		}
		h.ServeHTTP(w, r)
	}), nil
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

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	spec, err := req.spec()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.m.Create(r.Context(), spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewOf(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	var f sandbox.Filter
	q := r.URL.Query()
	if st := q.Get("state"); st != "" {
		state, err := sandbox.ParseState(st)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		f.State = state
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata filter %q must be KEY=VALUE", kv))
			return
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	writeJSON(w, http.StatusOK, views(s.m.List(f), viewOf))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Delete(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req TimeoutRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Timeout == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout (seconds) is required"))
		return
	}
	var f fields
	timeout := f.seconds(sandbox.RangeTimeout, req.Timeout)
	if f.err != nil {
		s.writeError(w, r, f.err)
		return
	}
	sb, err := s.m.SetTimeout(r.Context(), r.PathValue("id"), *timeout)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// exec streams a process's events as NDJSON. Errors before the process
// starts are ordinary error responses; later failures become an "error"
// event, since the status line is already sent.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkExec(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st := newExecStream(w, s.redactor(r))
	if err := s.m.Exec(r.Context(), r.PathValue("id"), req, st.exec); err != nil {
		st.fail(r, err)
	}
}

// checkExec checks what the server requires of an exec request.
func checkExec(req wire.ExecRequest) error {
	if (len(req.Cmd) == 0) == (req.Shell == "") {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "exactly one of cmd and shell must be set")
	}
	var f fields
	f.req(sandbox.RangeExecTimeout, req.TimeoutMS)
	f.req(sandbox.RangeExecOutput, req.MaxOutputBytes)
	return f.err
}

// execStream writes the events of an exec as newline-delimited JSON:
// status 200 and the headers with the first event (lazyHeader), and each
// event flushed but an exit, which ends the exec and which the end of the
// response carries in the same write.
type execStream struct {
	lazy   *lazyHeader
	rc     *http.ResponseController
	enc    *json.Encoder
	redact func(error) error // what the client may see of an error
}

func newExecStream(w http.ResponseWriter, redact func(error) error) *execStream {
	lazy := &lazyHeader{w: w}
	return &execStream{lazy: lazy, rc: http.NewResponseController(w), enc: json.NewEncoder(lazy), redact: redact}
}

// write writes the event v, then flushes when flush is set.
func (st *execStream) write(v any, flush bool) error {
	if err := st.enc.Encode(v); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	return st.rc.Flush()
}

// exec writes one exec event.
func (st *execStream) exec(ev wire.ExecEvent) error {
	return st.write(ev, ev.Type != wire.EventExit)
}

// fail reports err: as the response when nothing was written yet, else as
// a last error event, unless the client of r is gone.
func (st *execStream) fail(r *http.Request, err error) {
	if !st.lazy.started {
		wire.WriteError(st.lazy.w, st.redact(err))
		return
	}
	if r.Context().Err() == nil {
		_ = st.write(wire.ExecEvent{Type: wire.EventError, Error: errorOf(st.redact(err))}, true)
	}
}

// fileOp is the part of a file handler that runs once the sandbox's agent
// and the path are known; it returns the JSON answer, or nil when it wrote
// the response itself.
type fileOp func(ag *agent.Client, path string) (any, error)

// files resolves the running sandbox's agent and, when needPath is set, the
// required path query parameter, then runs op and writes its result as JSON
// (status 200) or its error.
func (s *Server) files(needPath bool, op fileOp) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if needPath && p == "" {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter path is required"))
			return
		}
		ag, err := s.m.Agent(r.PathValue("id"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out, err := op(ag, p)
		switch {
		case err != nil:
			s.writeError(w, r, err)
		case out != nil:
			writeJSON(w, http.StatusOK, out)
		}
	}
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agent.Client, p string) (any, error) {
		body, size, err := ag.ReadFile(r.Context(), p)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		if size >= 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		}
		w.WriteHeader(http.StatusOK)
		// A failure midway cuts the response short, so that a file of
		// unknown size never looks complete.
		if _, err := io.Copy(w, body); err != nil {
			panic(http.ErrAbortHandler)
		}
		return nil, nil
	})(w, r)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || sandbox.RangeFileMode.Check(int64(v)) != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "mode %q must be octal permission bits like 0644", m))
			return
		}
		mode = fileMode(uint32(v))
	}
	s.files(true, func(ag *agent.Client, p string) (any, error) {
		return ag.WriteFile(r.Context(), p, mode, r.Body)
	})(w, r)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agent.Client, p string) (any, error) {
		if err := ag.Remove(r.Context(), p, r.URL.Query().Get("recursive") == "true"); err != nil {
			return nil, err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil, nil
	})(w, r)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agent.Client, p string) (any, error) { return ag.Stat(r.Context(), p) })(w, r)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	s.files(true, func(ag *agent.Client, p string) (any, error) {
		list, err := ag.List(r.Context(), p)
		if list == nil && err == nil {
			list = []wire.FileInfo{}
		}
		return list, err
	})(w, r)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req wire.MkdirRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := sandbox.RangeFileMode.Check(int64(req.Mode)); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.files(false, func(ag *agent.Client, _ string) (any, error) { return ag.Mkdir(r.Context(), req) })(w, r)
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request) {
	var req wire.RenameRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.files(false, func(ag *agent.Client, _ string) (any, error) { return ag.Rename(r.Context(), req.From, req.To) })(w, r)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.m.Templates())
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.m.Template(r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// importTemplate makes a template from a rootfs tarball in the body, or
// from an image archive when the server has an image service.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Images != nil {
		s.importArchive(w, r)
		return
	}
	name := r.PathValue("name")
	t, err := s.m.CreateTemplate(r.Context(), name, "import", func(dir string) error {
		return untar.ExtractTar(r.Context(), r.Body, dir)
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteTemplate(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Images != nil {
		s.cfg.Images.Collect()
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildTemplate builds a template from a recipe and streams its log as
// NDJSON BuildEvents. Disconnecting cancels the build and removes what it
// made.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	if isMultipart(r) {
		s.buildFromFile(w, r)
		return
	}
	var req BuildRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	var fill func(ctx context.Context, dir string, progress io.Writer) error
	switch req.Recipe {
	case "busybox":
		fill = func(_ context.Context, dir string, _ io.Writer) error { return template.FillBusybox(dir, "") }
	case "debian":
		opts := template.DebianOptions{Mirror: req.Mirror, BuildEssential: req.BuildEssential}
		fill = func(ctx context.Context, dir string, progress io.Writer) error {
			return template.BuildDebian(ctx, dir, opts, progress)
		}
	default:
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown recipe %q (available: debian, busybox)", req.Recipe))
		return
	}
	if err := sandbox.ValidateTemplateName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := s.m.Template(name); err == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := &eventWriter{w: w, rc: http.NewResponseController(w)}
	redact := s.redactor(r)
	t, err := s.m.CreateTemplate(r.Context(), name, req.Recipe, func(dir string) error {
		return fill(r.Context(), dir, out)
	})
	out.flushLine()
	if err != nil {
		out.send(BuildEvent{Type: "error", Error: (*errorDetail)(errorOf(redact(err)))})
		return
	}
	out.send(BuildEvent{Type: "done", Template: &t})
}

// eventWriter turns a build's log output into "log" events, one per line.
type eventWriter struct {
	mu   sync.Mutex
	w    io.Writer
	rc   *http.ResponseController
	line []byte
}

func (e *eventWriter) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.line = append(e.line, p...)
	for {
		i := bytes.IndexByte(e.line, '\n')
		if i < 0 {
			break
		}
		e.sendLocked(BuildEvent{Type: "log", Text: string(e.line[:i])})
		e.line = e.line[i+1:]
	}
	return len(p), nil
}

func (e *eventWriter) flushLine() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.line) > 0 {
		e.sendLocked(BuildEvent{Type: "log", Text: string(e.line)})
		e.line = nil
	}
}

func (e *eventWriter) send(ev BuildEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sendLocked(ev)
}

func (e *eventWriter) sendLocked(ev BuildEvent) {
	b, err := json.Marshal(ev)
	if err != nil {
		panic(fmt.Sprintf("encoding build event: %v", err))
	}
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.rc.Flush()
}

// fileMode converts Unix permission bits (as in the mode query parameter)
// to Go's os.FileMode, whose setuid, setgid and sticky bits differ.
func fileMode(v uint32) os.FileMode {
	m := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
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
