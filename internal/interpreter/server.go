package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Languages a context can run.
const (
	LangPython     = "python"
	LangJavaScript = "javascript"
	LangBash       = "bash"
)

// languageNames maps the names a client may use to a language.
var languageNames = map[string]string{
	"python": LangPython, "python3": LangPython, "py": LangPython,
	"javascript": LangJavaScript, "js": LangJavaScript, "node": LangJavaScript, "nodejs": LangJavaScript,
	"bash": LangBash, "sh": LangBash, "shell": LangBash,
}

// Language resolves a language name ("" is Python). An unknown one is
// errdefs.ErrInvalidArgument.
func Language(name string) (string, error) {
	if name == "" {
		return LangPython, nil
	}
	if l, ok := languageNames[strings.ToLower(name)]; ok {
		return l, nil
	}
	return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "language %q is not available here: use python, javascript or bash", name)
}

// Tools names the interpreters' executables (looked up in PATH when not
// absolute).
type Tools struct {
	Python, Node, Bash string
}

// Options configure a Server.
type Options struct {
	Tools Tools
	// Dir is a private directory for connection files and cells; it must
	// exist.
	Dir string
	// Cwd is the working directory of contexts that name none.
	Cwd string
	// Env is the kernels' environment.
	Env []string
	// Cred, if set, is the identity the kernels run as.
	Cred *syscall.Credential
	// MaxOutput bounds the stdout and stderr bytes of one execution; past
	// it output is dropped and the end event counts what was. 0 means
	// DefaultMaxOutput.
	MaxOutput int64
	// Defaults are the languages whose default contexts start with the
	// server; the server is healthy once they run. Others start at their
	// first use.
	Defaults []string
	Log      *slog.Logger
}

// DefaultMaxOutput is the output limit of an execution unless
// Options.MaxOutput or the request says otherwise.
const DefaultMaxOutput = 8 << 20

// keepaliveAfter is the silence after which an execution stream carries
// a keepalive line, so that proxies do not close it.
const keepaliveAfter = 5 * time.Second

// Server is the code interpreter service: contexts, each one kernel, and
// the HTTP API of E2B's code interpreter (/health, /execute, /contexts).
// Safe for concurrent use; executions on one context run one at a time.
type Server struct {
	opts Options

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language -> id of its default context
	ready    chan struct{}     // closed once the Defaults run
	startErr error
}

// ContextInfo describes a context, as the API shows it.
type ContextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// codeContext is one kernel with its language and working directory.
type codeContext struct {
	ContextInfo

	run     sync.Mutex // held by the execution in progress, and by restart
	mu      sync.Mutex // guards k and deleted
	k       kernel     // nil after the kernel died or was killed
	dead    error      // why k is nil
	deleted bool
}

// NewServer returns a server and starts the default contexts in the
// background; Close stops every kernel.
func NewServer(opts Options) *Server {
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = DefaultMaxOutput
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, contexts: map[string]*codeContext{}, defaults: map[string]string{}, ready: make(chan struct{})}
	go func() {
		defer close(s.ready)
		for _, l := range opts.Defaults {
			begin := time.Now()
			if _, err := s.defaultContext(context.Background(), l); err != nil {
				s.mu.Lock()
				s.startErr = err
				s.mu.Unlock()
				opts.Log.Error("starting default context", "language", l, "error", err)
				return
			}
			opts.Log.Info("default context ready", "language", l, "duration_ms", time.Since(begin).Milliseconds())
		}
	}()
	return s
}

// Close kills every kernel.
func (s *Server) Close() {
	<-s.ready
	s.mu.Lock()
	all := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		all = append(all, c)
	}
	s.contexts = map[string]*codeContext{}
	s.defaults = map[string]string{}
	s.mu.Unlock()
	for _, c := range all {
		c.kill(errors.New("the service stopped"))
	}
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return mux
}

// health answers "OK" once the default contexts run: a template's ready
// check on it makes a sandbox's first execution skip the kernel start.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.ready:
	default:
		http.Error(w, "starting kernels", http.StatusServiceUnavailable)
		return
	}
	s.mu.Lock()
	err := s.startErr
	s.mu.Unlock()
	if err != nil {
		http.Error(w, "default context failed: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("OK"))
}

// ExecuteRequest is the body of POST /execute. TimeoutMS and
// MaxOutputBytes are Corral's additions.
type ExecuteRequest struct {
	Code           string            `json:"code"`
	ContextID      string            `json:"context_id,omitempty"`
	Language       string            `json:"language,omitempty"`
	Env            map[string]string `json:"env_vars,omitempty"`
	TimeoutMS      int64             `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"`
}

// ContextRequest is the body of POST /contexts.
type ContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}

// envName is what an environment variable's name may be: the kernels set
// them with shell and Python code.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckExecute checks a request as the service does.
func CheckExecute(req ExecuteRequest, maxOutput int64) error {
	if req.ContextID != "" && req.Language != "" {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "give a context_id or a language, not both")
	}
	if _, err := Language(req.Language); err != nil {
		return err
	}
	for k := range req.Env {
		if !envName.MatchString(k) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "env_vars: %q is not a variable name", k)
		}
	}
	if req.TimeoutMS < 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout_ms %d: want 0 (none) or more", req.TimeoutMS)
	}
	if req.MaxOutputBytes < 0 || (maxOutput > 0 && req.MaxOutputBytes > maxOutput) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "max_output_bytes %d: want 0 (the default) up to %d", req.MaxOutputBytes, maxOutput)
	}
	return nil
}

func decodeBody(r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(nil, r.Body, 64<<20)
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "request body: %v", err)
	}
	return nil
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req ExecuteRequest
	if err := decodeBody(r, &req); err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := CheckExecute(req, 0); err != nil {
		wire.WriteError(w, err)
		return
	}
	var c *codeContext
	var err error
	if req.ContextID != "" {
		c, err = s.context(req.ContextID)
	} else {
		lang, _ := Language(req.Language)
		c, err = s.defaultContext(r.Context(), lang)
	}
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := newLineWriter(w)
	stop := out.keepalive()
	defer stop()
	maxOut := s.opts.MaxOutput
	if req.MaxOutputBytes > 0 {
		maxOut = req.MaxOutputBytes
	}
	ctx := r.Context()
	if req.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	c.execute(ctx, req.Code, req.Env, maxOut, out.write)
}

// execute runs code on c and sends its events, the end event last.
func (c *codeContext) execute(ctx context.Context, code string, env map[string]string, maxOut int64, send func(Event)) {
	c.run.Lock()
	defer c.run.Unlock()
	c.mu.Lock()
	k, dead := c.k, c.dead
	c.mu.Unlock()
	if k == nil {
		send(deadEvent(c, dead))
		send(Event{Type: EventEnd})
		return
	}
	lim := &limiter{max: maxOut, send: send}
	count, err := k.run(ctx, code, env, lim.emit)
	if err != nil {
		c.mu.Lock()
		if c.k == k {
			c.k, c.dead = nil, err
		}
		c.mu.Unlock()
		k.kill()
		send(deadEvent(c, err))
	}
	if count > 0 {
		send(Event{Type: EventCount, Count: count})
	}
	send(Event{Type: EventEnd, TimedOut: errors.Is(ctx.Err(), context.DeadlineExceeded), Truncated: lim.dropped})
}

// deadEvent is the error an execution on a context without a kernel
// answers.
func deadEvent(c *codeContext, why error) Event {
	if why == nil {
		why = errKernelDied
	}
	return Event{Type: EventError, Name: "DeadKernelError", Value: why.Error(),
		Traceback: fmt.Sprintf("DeadKernelError: %v\nRestart the context (POST /contexts/%s/restart) to run code on it again.", why, c.ID)}
}

// limiter passes events on until the stdout and stderr bytes reach max,
// then one marker, then only the events that are not output.
type limiter struct {
	max, sent, dropped int64
	send               func(Event)
}

func (l *limiter) emit(e Event) {
	if e.Type != EventStdout && e.Type != EventStderr {
		l.send(e)
		return
	}
	n := int64(len(e.Text))
	switch {
	case l.dropped > 0:
		l.dropped += n
	case l.sent+n <= l.max:
		l.sent += n
		l.send(e)
	default:
		keep := l.max - l.sent
		for keep > 0 && !utf8.RuneStart(e.Text[keep]) {
			keep--
		}
		l.dropped = n - keep
		l.sent = l.max
		e.Text = e.Text[:keep] + fmt.Sprintf("\n[output truncated: the execution wrote more than %d bytes]\n", l.max)
		l.send(e)
	}
}

// lineWriter writes events as JSON lines, each flushed, from any
// goroutine.
type lineWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	last time.Time
}

func newLineWriter(w http.ResponseWriter) *lineWriter {
	return &lineWriter{w: w, rc: http.NewResponseController(w), last: time.Now()}
}

func (l *lineWriter) write(e Event) {
	b, err := json.Marshal(e)
	if err != nil {
		b, _ = json.Marshal(Event{Type: EventError, Name: "EncodingError", Value: err.Error()})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(append(b, '\n'))
	l.rc.Flush()
	l.last = time.Now()
}

// keepalive writes a keepalive line after each keepaliveAfter of silence
// until the returned function is called.
func (l *lineWriter) keepalive() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				l.mu.Lock()
				quiet := time.Since(l.last) >= keepaliveAfter
				l.mu.Unlock()
				if quiet {
					l.write(Event{Type: EventKeepalive})
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req ContextRequest
	if err := decodeBody(r, &req); err != nil {
		wire.WriteError(w, err)
		return
	}
	lang, err := Language(req.Language)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	c, err := s.newContext(r.Context(), lang, req.Cwd, false)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.ContextInfo)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := make([]ContextInfo, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c.ContextInfo)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c, ok := s.contexts[id]
	if ok {
		delete(s.contexts, id)
		for l, d := range s.defaults {
			if d == id {
				delete(s.defaults, l)
			}
		}
	}
	s.mu.Unlock()
	if !ok {
		wire.WriteError(w, errdefs.Errorf(errdefs.ErrNotFound, "context %s not found", id))
		return
	}
	c.mu.Lock()
	c.deleted = true
	c.mu.Unlock()
	c.kill(errors.New("the context was deleted"))
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	c, err := s.context(r.PathValue("id"))
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if err := s.restart(r.Context(), c); err != nil {
		wire.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.ContextInfo)
}

// restart kills c's kernel, which ends an execution in progress with an
// error, and starts a new one with no variables.
func (s *Server) restart(ctx context.Context, c *codeContext) error {
	c.kill(errors.New("the context is restarting"))
	c.run.Lock()
	defer c.run.Unlock()
	// A restart that ran meanwhile left a kernel of its own.
	c.kill(errors.New("the context is restarting"))
	k, err := startKernel(ctx, s.kernelConfig(c.Language, c.Cwd))
	if err != nil {
		return fmt.Errorf("restarting context %s: %w", c.ID, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted {
		k.kill()
		return errdefs.Errorf(errdefs.ErrNotFound, "context %s was deleted", c.ID)
	}
	c.k, c.dead = k, nil
	return nil
}

// kill ends c's kernel, if it has one.
func (c *codeContext) kill(why error) {
	c.mu.Lock()
	k := c.k
	c.k, c.dead = nil, why
	c.mu.Unlock()
	if k != nil {
		k.kill()
	}
}

func (s *Server) context(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contexts[id]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "context %s not found", id)
	}
	return c, nil
}

// defaultContext returns the default context of lang, starting it if
// there is none. Concurrent first uses start one.
func (s *Server) defaultContext(ctx context.Context, lang string) (*codeContext, error) {
	s.mu.Lock()
	if c, ok := s.contexts[s.defaults[lang]]; ok {
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	return s.newContext(ctx, lang, "", true)
}

// newContext starts a kernel for lang in cwd and records it; as the
// default of lang, unless another start won the race.
func (s *Server) newContext(ctx context.Context, lang, cwd string, asDefault bool) (*codeContext, error) {
	if cwd == "" {
		cwd = s.opts.Cwd
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cwd %q is not a directory", cwd)
	}
	k, err := startKernel(ctx, s.kernelConfig(lang, cwd))
	if err != nil {
		return nil, fmt.Errorf("starting a %s kernel: %w", lang, err)
	}
	c := &codeContext{ContextInfo: ContextInfo{ID: randomHex(8), Language: lang, Cwd: cwd}, k: k}
	s.mu.Lock()
	defer s.mu.Unlock()
	if asDefault {
		if c, ok := s.contexts[s.defaults[lang]]; ok {
			k.kill()
			return c, nil
		}
		s.defaults[lang] = c.ID
	}
	s.contexts[c.ID] = c
	return c, nil
}

func (s *Server) kernelConfig(lang, cwd string) kernelConfig {
	return kernelConfig{language: lang, cwd: cwd, env: slices.Clone(s.opts.Env), dir: s.opts.Dir, cred: s.opts.Cred, tools: s.opts.Tools}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
