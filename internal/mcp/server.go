package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// SessionKey is the metadata key that tags every sandbox an MCP session
// creates with a random tag of the session, so that listings show which
// sandboxes MCP clients made. Forks copy it.
const SessionKey = "corral.mcp.session"

// Policy is what the operator lets MCP clients do. A client cannot ask
// for more: a create that names another runtime, a network the policy
// does not cover, or one sandbox too many fails as a tool error.
type Policy struct {
	// Template is the template of sandboxes created without one (the
	// session sandbox among them); empty is the daemon's default.
	Template string
	// Runtimes, when not empty, are the runtimes clients may ask for; the
	// first is the default.
	Runtimes []string
	// MaxSandboxes is the most sandboxes one session may hold at once,
	// its session sandbox included (0: no limit of its own; the daemon's
	// admission still applies).
	MaxSandboxes int
	// Network is the network policy of sandboxes created without one, and
	// the most a client may ask for: with mode none only none, with an
	// allowlist only rules it covers, with open anything. An empty mode
	// is none.
	Network corral.NetworkPolicy
	// SessionIdle is how long a session sandbox may go unused before the
	// daemon deletes it, which bounds its life when a session ends without
	// the server seeing it (a killed process). 0 means 30 minutes.
	SessionIdle time.Duration
	// SessionTimeout, when positive, is the most a session sandbox lives;
	// 0 means until its session ends (a daemon with --max-timeout needs
	// one).
	SessionTimeout time.Duration
}

// Config configures a Server.
type Config struct {
	// Client returns the API client for a request, given the headers of
	// the HTTP request that carried it (nil over stdio). It is called
	// once per session, on the session's first tool call.
	Client func(header http.Header) (*corral.Client, error)
	// UnixSocket is the daemon's socket when the client reaches it there,
	// for port_url to say how to reach a port.
	UnixSocket string
	Policy     Policy
	// Version is reported to clients as the server's version.
	Version string
	Logger  *slog.Logger
}

// Server is an MCP server of Corral's tools. It is safe for concurrent
// use by any number of sessions.
type Server struct {
	cfg Config
	log *slog.Logger
	mcp *mcp.Server

	// calls is the parent of every tool call's context: Close cancels it,
	// so that a long exec does not hold the end of a session.
	calls    context.Context
	stopAll  context.CancelFunc
	mu       sync.Mutex
	sessions map[*mcp.ServerSession]*session
	closed   bool
	wg       sync.WaitGroup // session watchers
}

// session is the server's state for one MCP session.
type session struct {
	tag    string // value of SessionKey on its sandboxes
	client *corral.Client
	base   string // scheme://host the HTTP client reached us at, "" over stdio

	// mu serializes the creation of the session sandbox, so that
	// concurrent first calls share one.
	mu      sync.Mutex
	sandbox string // the session sandbox's ID, "" until first use

	ownMu sync.Mutex
	owned map[string]bool // IDs of the sandboxes the session created
}

// own records sandboxes the session created.
func (st *session) own(ids ...string) {
	st.ownMu.Lock()
	defer st.ownMu.Unlock()
	for _, id := range ids {
		st.owned[id] = true
	}
}

// New returns a Server with every tool and the sandbox resources.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[*mcp.ServerSession]*session{}}
	s.calls, s.stopAll = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.Policy.SessionIdle <= 0 {
		s.cfg.Policy.SessionIdle = 30 * time.Minute
	}
	version := cfg.Version
	if version == "" {
		version = "dev"
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "corral", Title: "Corral sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: instructions, Logger: s.log, Capabilities: &mcp.ServerCapabilities{
			Tools:     &mcp.ToolCapabilities{},
			Resources: &mcp.ResourceCapabilities{},
		}})
	s.addTools()
	s.addResources()
	return s
}

// instructions tell a model what the server is for and how its pieces fit.
const instructions = `Corral runs commands and code in disposable, isolated Linux sandboxes.
Use "exec" to run a shell command and "run_code" to run Python, JavaScript or bash in a stateful interpreter. Without a sandbox_id both use this session's own sandbox, created on first use and deleted when the session ends; files written by one call are there for the next.
Create further sandboxes with "sandbox_create" and pass their sandbox_id to other tools. Start long-running work (servers, builds) with "process_start", then read its output with "process_output"; "port_url" gives the URL of a server in a sandbox.
Long output is cut to its start and end, with a note of what was left out and how to read the rest.`

// MCP returns the underlying server, to connect transports to.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one session on t (for `corral mcp`, stdin and stdout) until
// the client disconnects, then deletes the session sandbox. When ctx ends
// first, Run closes the server (Close): it is meant for a process that
// serves one client.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	ss, err := s.mcp.Connect(ctx, t, nil)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- ss.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		s.Close()
	}
	s.endSession(ss)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil // the session ended because the server did
	}
	return err
}

// originHeader carries, from HTTPHandler to the tools, the scheme and
// host at which the client reached the server: port_url answers with
// URLs on the same host.
const originHeader = "X-Corral-Mcp-Origin"

// HTTPHandler serves the streamable HTTP transport. Sessions idle for
// longer than idle are closed (and their sandboxes deleted); idle must be
// positive, because a client that goes away without ending its session
// would otherwise hold it forever.
func (s *Server) HTTPHandler(idle time.Duration) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: idle, Logger: s.log,
			// The daemon authenticates every request with its API key,
			// which a page a browser was tricked into loading cannot
			// send; the guard against DNS rebinding would only refuse
			// the daemon's own non-loopback listeners.
			DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		r.Header.Set(originHeader, scheme+"://"+r.Host)
		h.ServeHTTP(w, r)
	})
}

// Close ends every session and deletes their session sandboxes; tool
// calls in flight are cancelled. The daemon calls it when it stops: HTTP
// sessions do not outlive it.
func (s *Server) Close() {
	s.stopAll()
	s.mu.Lock()
	s.closed = true
	var open []*mcp.ServerSession
	for ss := range s.sessions {
		open = append(open, ss)
	}
	s.mu.Unlock()
	for _, ss := range open {
		ss.Close()
	}
	s.wg.Wait()
}

// state returns the session of a request, setting it up on the first
// call: its API client, and a watcher that cleans up when it ends.
func (s *Server) state(req mcp.Request) (*session, error) {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if ss == nil {
		return nil, errors.New("request without a session")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.sessions[ss]; st != nil {
		return st, nil
	}
	if s.closed {
		return nil, &corral.Error{Code: corral.CodeUnavailable, Message: "the MCP server is shutting down"}
	}
	var header http.Header
	if extra := req.GetExtra(); extra != nil {
		header = extra.Header
	}
	client, err := s.cfg.Client(header)
	if err != nil {
		return nil, err
	}
	st := &session{tag: newTag(), client: client, owned: map[string]bool{}}
	st.base = header.Get(originHeader)
	s.sessions[ss] = st
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = ss.Wait()
		s.endSession(ss)
	}()
	return st, nil
}

// endSession forgets a session and deletes its session sandbox. It runs
// once per session however often it is called.
func (s *Server) endSession(ss *mcp.ServerSession) {
	s.mu.Lock()
	st := s.sessions[ss]
	delete(s.sessions, ss)
	s.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	id := st.sandbox
	st.sandbox = ""
	st.mu.Unlock()
	if id != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := st.client.Delete(ctx, id)
		cancel()
		if err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
			s.log.Warn("deleting an MCP session's sandbox", "sandbox", id, "error", err)
		} else {
			s.log.Info("MCP session ended; its sandbox is deleted", "sandbox", id)
		}
	}
	st.client.Close()
}

// sessionSandbox returns the ID of the session's own sandbox, creating it
// on first use. A sandbox that was deleted meanwhile (by a tool call, its
// idle timeout or another client) is replaced.
func (s *Server) sessionSandbox(ctx context.Context, st *session) (string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sandbox != "" {
		sb, err := st.client.Get(ctx, st.sandbox)
		switch {
		case err == nil && (sb.State == "running" || sb.State == "paused" || sb.State == "stopped"):
			if sb.State != "running" {
				if err := resumeOrStart(ctx, st.client, sb); err != nil {
					return "", err
				}
			}
			return st.sandbox, nil
		case err == nil || corral.ErrorCode(err) == corral.CodeNotFound:
			// Gone or broken: make a new one below.
			if err == nil {
				_ = st.client.Delete(ctx, st.sandbox)
			}
			st.sandbox = ""
		default:
			return "", err
		}
	}
	if err := s.checkCount(ctx, st, 1); err != nil {
		return "", err
	}
	opts := s.createDefaults(st)
	opts.IdleTimeout = s.cfg.Policy.SessionIdle
	opts.Timeout = corral.NoTimeout
	if s.cfg.Policy.SessionTimeout > 0 {
		opts.Timeout = corral.Timeout(s.cfg.Policy.SessionTimeout)
	}
	sb, err := st.client.Create(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("creating this session's sandbox: %w", err)
	}
	if !s.live(st) {
		// The session ended during the create: nobody would delete it.
		_ = st.client.Delete(context.WithoutCancel(ctx), sb.ID)
		return "", &corral.Error{Code: corral.CodeUnavailable, Message: "the MCP session ended"}
	}
	st.sandbox = sb.ID
	st.own(sb.ID)
	return sb.ID, nil
}

// live reports whether st is still a session of s.
func (s *Server) live(st *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.sessions {
		if o == st {
			return true
		}
	}
	return false
}

// resumeOrStart brings a paused or stopped sandbox back with the deadline
// it had: the time it had left (the deadline runs on while a sandbox is
// paused), none if it had none, or the daemon's default when it has
// passed (a sandbox the deadline paused or stopped).
func resumeOrStart(ctx context.Context, c *corral.Client, sb *corral.Sandbox) error {
	timeout := corral.NoTimeout
	if sb.Deadline != nil {
		timeout = nil
		if left := time.Until(*sb.Deadline); left >= time.Second {
			timeout = &left
		}
	}
	var err error
	switch sb.State {
	case "paused":
		_, err = c.Resume(ctx, sb.ID, timeout)
	case "stopped":
		_, err = c.Start(ctx, sb.ID, timeout)
	}
	return err
}

// createDefaults returns the create options of a sandbox that asks for
// nothing: the policy's template, runtime and network, tagged with the
// session.
func (s *Server) createDefaults(st *session) corral.CreateOptions {
	p := s.cfg.Policy
	opts := corral.CreateOptions{Template: p.Template, Metadata: map[string]string{SessionKey: st.tag}}
	if len(p.Runtimes) > 0 {
		opts.Runtime = p.Runtimes[0]
	}
	n := p.Network
	if n.Mode == "" {
		n.Mode = corral.NetworkNone
	}
	opts.Network = &n
	return opts
}

// checkCount fails when n more sandboxes would take the session past
// Policy.MaxSandboxes. The session counts the sandboxes it created that
// still exist, whatever their metadata says. Concurrent creates of one
// session may each pass the check; the daemon's own admission bounds
// what that can add.
func (s *Server) checkCount(ctx context.Context, st *session, n int) error {
	limit := s.cfg.Policy.MaxSandboxes
	if limit <= 0 {
		return nil
	}
	all, err := st.client.List(ctx, corral.ListOptions{})
	if err != nil {
		return err
	}
	exists := map[string]bool{}
	for _, sb := range all {
		if sb.State != "deleting" {
			exists[sb.ID] = true
		}
	}
	st.ownMu.Lock()
	for id := range st.owned {
		if !exists[id] {
			delete(st.owned, id)
		}
	}
	held := len(st.owned)
	st.ownMu.Unlock()
	if held+n > limit {
		return &corral.Error{Code: corral.CodeResourceExhausted, Message: fmt.Sprintf(
			"this session holds %d of the %d sandboxes it may have; delete one with sandbox_kill first", held, limit)}
	}
	return nil
}

// sandboxFor returns the sandbox a tool call names, or the session's own.
func (s *Server) sandboxFor(ctx context.Context, st *session, id string) (string, error) {
	if id = strings.TrimSpace(id); id != "" {
		return id, nil
	}
	return s.sessionSandbox(ctx, st)
}

// newTag returns a random tag for a session's sandboxes.
func newTag() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
