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
	// Client returns the API client for a session, given the headers of
	// the HTTP request that carried its first tool call or resource read
	// (nil over stdio). The session closes the client when it ends.
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

	// mu serializes looking after the session sandbox (create, resume,
	// renew), so that concurrent calls share one.
	mu sync.Mutex
	// renew, when positive, is the deadline the session sandbox is given
	// again whenever less than half of it is left (a daemon that refuses
	// sandboxes without a deadline).
	renew time.Duration

	idMu     sync.Mutex
	sandbox  string // the session sandbox's ID, "" until first use
	replaced bool   // the session sandbox was replaced by a new one

	// createMu makes counting the session's sandboxes and creating more
	// one step, so that concurrent creates cannot pass MaxSandboxes.
	createMu sync.Mutex
	ownMu    sync.Mutex
	owned    map[string]bool // IDs of the sandboxes the session created

	end sync.Once // the session's clean-up
}

// own records sandboxes the session created.
func (st *session) own(ids ...string) {
	st.ownMu.Lock()
	defer st.ownMu.Unlock()
	for _, id := range ids {
		st.owned[id] = true
	}
}

// sessionID is the ID of the session sandbox, "" before it exists.
func (st *session) sessionID() string {
	st.idMu.Lock()
	defer st.idMu.Unlock()
	return st.sandbox
}

func (st *session) setSessionID(id string) {
	st.idMu.Lock()
	defer st.idMu.Unlock()
	st.sandbox = id
}

// takeReplaced reports, once, that the session sandbox was replaced.
func (st *session) takeReplaced() bool {
	st.idMu.Lock()
	defer st.idMu.Unlock()
	r := st.replaced
	st.replaced = false
	return r
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
// the client disconnects, then deletes the session sandbox before it
// returns. When ctx ends first, Run closes the server (Close): it is
// meant for a process that serves one client.
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
			// The SDK's guard against DNS rebinding refuses requests that
			// reach a loopback listener with another Host (an SSH tunnel,
			// a reverse proxy). The daemon checks its API key on every
			// request before this handler, which a page a browser was
			// tricked into loading cannot send.
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

// Close ends every session, deletes their session sandboxes and returns
// once that is done; tool calls in flight are cancelled. The daemon calls
// it when it stops: HTTP sessions do not outlive it.
func (s *Server) Close() {
	s.stopAll()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for ss := range s.mcp.Sessions() {
		ss.Close()
		s.endSession(ss)
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

// endSession deletes the session's sandbox and forgets the session. It
// runs the clean-up once however often it is called, and every call
// returns after it is done.
func (s *Server) endSession(ss *mcp.ServerSession) {
	s.mu.Lock()
	st := s.sessions[ss]
	s.mu.Unlock()
	if st == nil {
		return
	}
	st.end.Do(func() {
		if id := st.sessionID(); id != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := st.client.Delete(ctx, id)
			cancel()
			if err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
				s.log.Warn("deleting an MCP session's sandbox", "sandbox_id", id, "err", err)
			} else {
				s.log.Info("MCP session ended; its sandbox is deleted", "sandbox_id", id)
			}
		}
		st.client.Close()
	})
	s.mu.Lock()
	delete(s.sessions, ss)
	s.mu.Unlock()
}

// sessionSandbox returns the ID of the session's own sandbox, creating it
// on first use. A session sandbox that is gone or broken (deleted by a
// tool call, its idle timeout or another client) is replaced, and the
// call's result says so; a paused or stopped one is resumed; one whose
// daemon-imposed deadline is half gone gets it again.
func (s *Server) sessionSandbox(ctx context.Context, st *session) (string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if id := st.sessionID(); id != "" {
		sb, err := st.client.Get(ctx, id)
		if err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
			return "", err
		}
		switch {
		case err != nil || sb.State == "deleting":
		case sb.State == "error":
			_ = st.client.Delete(ctx, id)
		case sb.State == "running":
			if st.renew > 0 && sb.Deadline != nil && time.Until(*sb.Deadline) < st.renew/2 {
				if _, err := st.client.SetTimeout(ctx, id, st.renew); err != nil {
					return "", err
				}
			}
			return id, nil
		case sb.State == "paused" || sb.State == "stopped":
			if err := resumeOrStart(ctx, st.client, sb); err != nil {
				return "", err
			}
			return id, nil
		default:
			return "", &corral.Error{Status: 409, Code: corral.CodeFailedPrecondition,
				Message: fmt.Sprintf("this session's sandbox %s is %s; try again shortly", id, sb.State)}
		}
		// Gone or broken: a new one below, and the call says so.
		st.idMu.Lock()
		st.sandbox, st.replaced = "", true
		st.idMu.Unlock()
	}
	opts := s.createDefaults(st)
	opts.IdleTimeout = s.cfg.Policy.SessionIdle
	opts.Timeout = corral.NoTimeout
	if s.cfg.Policy.SessionTimeout > 0 {
		opts.Timeout = corral.Timeout(s.cfg.Policy.SessionTimeout)
	}
	sb, err := s.create(ctx, st, opts)
	if err != nil && s.cfg.Policy.SessionTimeout == 0 && corral.ErrorCode(err) == corral.CodeInvalidArgument {
		// A daemon with --max-timeout refuses sandboxes without a
		// deadline: take its default, and renew it while it is used.
		opts.Timeout = nil
		if sb, err = s.create(ctx, st, opts); err == nil && sb.Deadline != nil {
			st.renew = time.Until(*sb.Deadline).Round(time.Second)
		}
	}
	if err != nil {
		return "", fmt.Errorf("creating this session's sandbox: %w", err)
	}
	if !s.live(st) {
		// The session ended during the create: nobody would delete it.
		_ = st.client.Delete(context.WithoutCancel(ctx), sb.ID)
		return "", &corral.Error{Code: corral.CodeUnavailable, Message: "the MCP session ended"}
	}
	st.setSessionID(sb.ID)
	return sb.ID, nil
}

// create creates a sandbox for the session once Policy.MaxSandboxes
// leaves room for it, and records it as the session's.
func (s *Server) create(ctx context.Context, st *session, opts corral.CreateOptions) (*corral.Sandbox, error) {
	st.createMu.Lock()
	defer st.createMu.Unlock()
	if err := s.checkCount(ctx, st, 1); err != nil {
		return nil, err
	}
	sb, err := st.client.Create(ctx, opts)
	if err != nil {
		return nil, err
	}
	st.own(sb.ID)
	return sb, nil
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
// still exist, whatever their metadata says. Callers hold st.createMu
// over the check and the create.
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
		return &corral.Error{Status: 429, Code: corral.CodeResourceExhausted, Message: fmt.Sprintf(
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
