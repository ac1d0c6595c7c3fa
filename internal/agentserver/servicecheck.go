package agentserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// Default pauses between two ready attempts: probes are cheap, a
	// command costs a fork.
	defaultProbeInterval   = 100 * time.Millisecond
	defaultCommandInterval = 250 * time.Millisecond
	// Bounds of one attempt.
	probeAttemptTimeout   = time.Second
	commandAttemptTimeout = 10 * time.Second
)

// readyCheck is a validated wire.ReadyCheck.
type readyCheck struct {
	cmd      *procSpec // a foreground command; exit 0 is ready
	addr     string    // host:port that must accept a TCP connection
	url      string    // must answer with a status below 400
	interval time.Duration
}

// newReadyCheck validates rc; a command runs with the environment,
// directory and user of start.
func (s *Server) newReadyCheck(rc *wire.ReadyCheck, start *wire.ExecRequest) (*readyCheck, error) {
	if rc == nil {
		return nil, nil
	}
	set := 0
	for _, b := range []bool{len(rc.Cmd) > 0, rc.Shell != "", rc.Port != 0, rc.URL != ""} {
		if b {
			set++
		}
	}
	if set != 1 {
		return nil, errorf(errdefs.ErrInvalidArgument, "ready check must set exactly one of cmd, shell, port and url")
	}
	if rc.IntervalMS < 0 {
		return nil, errorf(errdefs.ErrInvalidArgument, "ready check interval_ms must not be negative")
	}
	c := &readyCheck{interval: time.Duration(rc.IntervalMS) * time.Millisecond}
	def := defaultProbeInterval
	switch {
	case rc.Port != 0:
		if rc.Port < 1 || rc.Port > 65535 {
			return nil, errorf(errdefs.ErrInvalidArgument, "invalid ready port %d: want 1 to 65535", rc.Port)
		}
		c.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(rc.Port))
	case rc.URL != "":
		u, err := url.Parse(rc.URL)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return nil, errorf(errdefs.ErrInvalidArgument, "invalid ready url %q: want an http:// URL", rc.URL)
		}
		c.url = u.String()
	default:
		req := wire.ExecRequest{Cmd: rc.Cmd, Shell: rc.Shell, Env: start.Env, Cwd: start.Cwd, User: start.User}
		spec, err := s.prepare(&req)
		if err != nil {
			return nil, fmt.Errorf("ready check command: %w", err)
		}
		c.cmd, def = &spec, defaultCommandInterval
	}
	if c.interval == 0 {
		c.interval = def
	}
	return c, nil
}

// run makes one attempt and reports whether it passed.
func (c *readyCheck) run(ctx context.Context, s *Server) bool {
	switch {
	case c.addr != "":
		d := net.Dialer{Timeout: probeAttemptTimeout}
		conn, err := d.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	case c.url != "":
		return c.probeURL(ctx)
	default:
		return c.runCommand(ctx, s)
	}
}

// probeURL sends one GET. Redirects are not followed: any answer below
// 400, a 3xx too, means the server is up.
func (c *readyCheck) probeURL(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
	defer cancel()
	// A transport of its own, without keep-alive or proxy: nothing stays
	// open between attempts.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode < 400
}

// runCommand runs the check command in the foreground, bounded by
// commandAttemptTimeout and ctx, and reports whether it exited 0.
func (c *readyCheck) runCommand(ctx context.Context, s *Server) bool {
	spec := *c.cmd
	spec.timeout = commandAttemptTimeout
	sub := newSubscriber()
	p, err := s.procs.start(spec, sub)
	if err != nil {
		return false
	}
	stop := afterFunc(ctx, p.kill)
	defer stop()
	for range sub.ch {
		// Its output is not used; reading it keeps the command going.
	}
	return !p.exit.lost && p.exit.code == 0 && p.exit.signal == ""
}
