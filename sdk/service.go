package corral

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// Restart policies of a template's service.
const (
	RestartNever     = "never"      // leave it ended (the default)
	RestartOnFailure = "on-failure" // start it again when it fails
	RestartAlways    = "always"     // start it again whenever it ends
)

// Service states, in ServiceStatus.State.
const (
	ServiceStarting = "starting"
	ServiceReady    = "ready"
	ServiceExited   = "exited"
	ServiceFailed   = "failed"
)

// Service is a template's start command, how it is restarted and when it
// is ready. Every new sandbox of the template starts it with the
// template's Defaults, and is running only once it is ready. Exactly one
// of Cmd and Shell is set.
type Service struct {
	Cmd   []string `json:"cmd,omitempty"`
	Shell string   `json:"shell,omitempty"`
	// Restart is one of the Restart constants; empty means RestartNever.
	Restart string `json:"restart,omitempty"`
	// Ready gates "running"; nil means ready once the command started.
	Ready *ReadyCheck `json:"ready,omitempty"`
	// ReadyTimeoutMS bounds the wait for readiness; 0 means the daemon's
	// default (60 s).
	ReadyTimeoutMS int64 `json:"ready_timeout_ms,omitempty"`
}

// ReadyCheck says when a service is ready: exactly one of a command
// (Cmd or Shell) that exits 0, a loopback TCP Port that accepts, or an
// http:// URL (as seen in the sandbox) that answers below 400.
type ReadyCheck struct {
	Cmd   []string `json:"cmd,omitempty"`
	Shell string   `json:"shell,omitempty"`
	Port  int      `json:"port,omitempty"`
	URL   string   `json:"url,omitempty"`
	// IntervalMS is the pause between attempts; 0 means the default.
	IntervalMS int64 `json:"interval_ms,omitempty"`
}

// ServiceStatus describes a sandbox's service.
type ServiceStatus struct {
	State    string     `json:"state"`
	PID      int        `json:"pid,omitempty"`
	Restarts int        `json:"restarts"`
	ReadyAt  *time.Time `json:"ready_at,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	// Error says why the service is exited or failed; Output is the tail
	// of its output when it is not ready.
	Error  string `json:"error,omitempty"`
	Output string `json:"output,omitempty"`
}

// SetTemplateService replaces the service of template name; nil removes
// it. Sandboxes made afterwards start the new service, running ones keep
// theirs. A bad service is CodeInvalidArgument naming the field.
func (c *Client) SetTemplateService(ctx context.Context, name string, sv *Service) (*Template, error) {
	var t Template
	path := "/v1/templates/" + url.PathEscape(name) + "/service"
	var err error
	if sv == nil {
		err = c.doJSON(ctx, "DELETE", path, nil, nil, &t)
	} else {
		err = c.doJSON(ctx, "PUT", path, nil, sv, &t)
	}
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// SandboxService describes the service of sandbox id; a sandbox whose
// template has none is CodeNotFound.
func (c *Client) SandboxService(ctx context.Context, id string) (*ServiceStatus, error) {
	var st ServiceStatus
	if err := c.doJSON(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/service", nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// DockerfileService is the service of a Dockerfile build. Without Start,
// a CMD or ENTRYPOINT written in the Dockerfile itself is the start
// command (one inherited from the FROM image never is).
type DockerfileService struct {
	// Start and Ready are shell commands; ReadyPort and ReadyURL the
	// other ready checks (at most one of the three).
	Start, Ready string
	ReadyPort    int
	ReadyURL     string
	ReadyTimeout time.Duration
	Restart      string
	// NoStart keeps the Dockerfile's CMD and ENTRYPOINT from starting;
	// it excludes the other fields.
	NoStart bool
}

// query adds the build's service parameters to q.
func (s DockerfileService) query(q url.Values) {
	for k, v := range map[string]string{"start": s.Start, "ready": s.Ready, "ready_url": s.ReadyURL, "restart": s.Restart} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if s.ReadyPort != 0 {
		q.Set("ready_port", strconv.Itoa(s.ReadyPort))
	}
	if s.ReadyTimeout != 0 {
		q.Set("ready_timeout", strconv.FormatFloat(s.ReadyTimeout.Seconds(), 'f', -1, 64))
	}
	if s.NoStart {
		q.Set("no_start", "true")
	}
}
