package corral

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"
)

// Sandbox is a sandbox as the daemon reports it.
type Sandbox struct {
	ID       string  `json:"id"`
	Template string  `json:"template"`
	Runtime  string  `json:"runtime"`
	State    string  `json:"state"` // creating, running, paused, error, deleting
	CPUs     float64 `json:"cpus"`
	MemoryMB int64   `json:"memory_mb"`
	Pids     int64   `json:"pids"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	// Tenant owns the sandbox (the tenant of the key that made it); "" is
	// the operator's. Other tenants' keys do not see it.
	Tenant    string            `json:"tenant,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	Deadline  *time.Time        `json:"deadline,omitempty"`
	Error     string            `json:"error,omitempty"`
	// Network is the sandbox's network policy, header values left out.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Mounts are the host directories the sandbox sees, each with its
	// Mode, shallower targets first (no target lies inside another).
	Mounts []Mount `json:"mounts,omitempty"`
	// IdleTimeout is the idle timeout in seconds (0: none); OnDeadline and
	// OnIdle are ActionDestroy, ActionPause or ActionStop.
	IdleTimeout int64  `json:"idle_timeout,omitempty"`
	OnDeadline  string `json:"on_deadline,omitempty"`
	OnIdle      string `json:"on_idle,omitempty"`
}

// CreateOptions describe a new sandbox. Zero values take the daemon's
// defaults.
type CreateOptions struct {
	Template string
	Runtime  string
	CPUs     float64
	MemoryMB int64
	Pids     int64
	DiskMB   int64
	// Timeout is the sandbox's lifetime; nil takes the daemon default and
	// NoTimeout asks for no deadline.
	Timeout  *time.Duration
	Env      map[string]string
	Metadata map[string]string
	// Network is the sandbox's network policy; nil takes the daemon's
	// default mode (none unless configured).
	Network *NetworkPolicy
	// Pool names a warm pool to claim the sandbox from (see SetPool);
	// empty uses a pool of the same shape when one has a sandbox ready.
	Pool string
	// IdleTimeout, when positive, fires OnIdle after that long (whole
	// seconds) without exec, file or PTY activity. OnDeadline and OnIdle
	// are ActionDestroy (the default), ActionPause or ActionStop.
	IdleTimeout time.Duration
	OnDeadline  string
	OnIdle      string
	// FromSnapshot starts the sandbox from a snapshot (see Snapshot);
	// Template, Runtime, limits and Env then default to the snapshot's.
	FromSnapshot string
	// Mounts are host directories the sandbox sees, as with docker run
	// -v. The daemon refuses them (CodePermissionDenied) unless its
	// operator allows the sources (corral server --allow-mount DIR).
	Mounts []Mount
}

// Mount is a host directory or a volume a sandbox sees: set exactly one
// of Source and Volume.
type Mount struct {
	// Source is the absolute host path of the directory, beneath one the
	// daemon allows; no part of it may be a symlink.
	Source string `json:"source,omitempty"`
	// Volume names a volume (CreateVolume) to mount instead.
	Volume string `json:"volume,omitempty"`
	// Target is the absolute path in the sandbox.
	Target string `json:"target"`
	// Mode is MountReadOnly, MountReadWrite (when empty) or
	// MountCopyOnWrite.
	Mode string `json:"mode,omitempty"`
}

// Mount modes, for Mount.Mode.
const (
	// MountReadOnly shows the directory read-only.
	MountReadOnly = "ro"
	// MountReadWrite lets the sandbox's writes reach the directory; what
	// it creates belongs on the host to the directory's owner.
	MountReadWrite = "rw"
	// MountCopyOnWrite shows the directory writable, but keeps every
	// change in the sandbox: the host directory never changes.
	MountCopyOnWrite = "cow"
)

// Lifecycle actions, for CreateOptions and UpdateOptions.
const (
	ActionDestroy = "destroy"
	ActionPause   = "pause"
	// ActionStop stops the sandbox (Client.Stop): its files stay for a
	// later Start.
	ActionStop = "stop"
)

// NoTimeout, used as CreateOptions.Timeout or with SetTimeout, asks for a
// sandbox without a deadline (when the daemon allows it).
var NoTimeout = new(time.Duration)

// Timeout returns a pointer to d, for CreateOptions.Timeout.
func Timeout(d time.Duration) *time.Duration { return &d }

type createRequest struct {
	Template string            `json:"template,omitempty"`
	Runtime  string            `json:"runtime,omitempty"`
	CPUs     float64           `json:"cpus,omitempty"`
	MemoryMB int64             `json:"memory_mb,omitempty"`
	Pids     int64             `json:"pids,omitempty"`
	DiskMB   int64             `json:"disk_mb,omitempty"`
	Timeout  *int64            `json:"timeout,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  *NetworkPolicy    `json:"network,omitempty"`

	Pool         string `json:"pool,omitempty"`
	IdleTimeout  int64  `json:"idle_timeout,omitempty"`
	OnDeadline   string `json:"on_deadline,omitempty"`
	OnIdle       string `json:"on_idle,omitempty"`
	FromSnapshot string `json:"from_snapshot,omitempty"`

	Mounts []Mount `json:"mounts,omitempty"`
}

// seconds rounds d away from zero to whole seconds, so that a small
// negative duration stays negative (and is refused) instead of becoming 0,
// which means "no deadline".
func seconds(d time.Duration) *int64 {
	s := int64(d / time.Second)
	switch r := d % time.Second; {
	case r > 0:
		s++
	case r < 0:
		s--
	}
	return &s
}

// Create creates a sandbox and returns it once it is running.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "POST", "/v1/sandboxes", nil, opts.request(), &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

func (opts CreateOptions) request() createRequest {
	req := createRequest{
		Template: opts.Template, Runtime: opts.Runtime, CPUs: opts.CPUs, MemoryMB: opts.MemoryMB,
		Pids: opts.Pids, DiskMB: opts.DiskMB, Env: opts.Env, Metadata: opts.Metadata, Network: opts.Network,
		Pool: opts.Pool, IdleTimeout: *seconds(opts.IdleTimeout), OnDeadline: opts.OnDeadline, OnIdle: opts.OnIdle,
		FromSnapshot: opts.FromSnapshot, Mounts: opts.Mounts,
	}
	if opts.Timeout != nil {
		req.Timeout = seconds(*opts.Timeout)
	}
	return req
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filter List; zero values match everything.
type ListOptions struct {
	State    string
	Metadata map[string]string
}

// List returns sandboxes, oldest first.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Metadata {
		q.Add("metadata", k+"="+v)
	}
	var out []Sandbox
	if err := c.doJSON(ctx, "GET", "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Delete destroys a sandbox.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.doJSON(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, nil)
}

// SetTimeout sets the sandbox's deadline to now + d (NoTimeout's value, 0,
// removes it where allowed).
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	var sb Sandbox
	body := map[string]*int64{"timeout": seconds(d)}
	if err := c.doJSON(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/timeout", nil, body, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Stats are a sandbox's resource readings.
type Stats struct {
	MemoryBytes   int64 `json:"memory_bytes"`
	CPUUsageNanos int64 `json:"cpu_usage_ns"`
	Pids          int64 `json:"pids"`
	OOMKills      int64 `json:"oom_kills"`
}

// Stats reads a sandbox's resource usage.
func (c *Client) Stats(ctx context.Context, id string) (*Stats, error) {
	var st Stats
	if err := c.doJSON(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/stats", nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ExecOptions describe a process. Exactly one of Cmd and Shell is set.
type ExecOptions struct {
	Cmd   []string
	Shell string // run with /bin/sh -c
	Env   map[string]string
	Cwd   string
	User  string // name or uid[:gid]; default root
	// Stdin is written to the process, then closed; nil means /dev/null.
	Stdin []byte
	// Timeout kills the process after d; 0 means none.
	Timeout time.Duration
	// MaxOutputBytes caps the output streamed back (stdout and stderr
	// together); past it the daemon sends one marker line on stderr and
	// discards the rest. 0 means the daemon's default (64 MiB unless
	// configured otherwise).
	MaxOutputBytes int64
	// Stdout and Stderr receive output as it arrives; nil discards it.
	Stdout, Stderr io.Writer
}

// ExecResult is how a process ended.
type ExecResult struct {
	PID int
	// ExitCode is the exit status, or 128+signal number after a signal.
	ExitCode  int
	Signal    string
	OOMKilled bool
	TimedOut  bool
	// OutputDiscarded counts the output bytes not sent because the
	// output passed its cap (OutputTruncated).
	OutputTruncated bool
	OutputDiscarded int64
}

type execRequest struct {
	Cmd       []string          `json:"cmd,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Stdin     []byte            `json:"stdin,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	MaxOutput int64             `json:"max_output_bytes,omitempty"`
}

type execEvent struct {
	Type      string `json:"type"`
	PID       int    `json:"pid"`
	Text      string `json:"text"`
	Data      []byte `json:"data"`
	ExitCode  *int   `json:"exit_code"`
	Signal    string `json:"signal"`
	OOMKilled bool   `json:"oom_killed"`
	TimedOut  bool   `json:"timed_out"`
	Truncated bool   `json:"output_truncated"`
	Discarded int64  `json:"output_discarded"`
	Error     *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Offset  int64 `json:"offset"`
	Dropped int64 `json:"dropped"`
}

// bytes returns the output an output event carries.
func (ev *execEvent) bytes() []byte {
	if ev.Text != "" {
		return []byte(ev.Text)
	}
	return ev.Data
}

// result returns the exit status an exit event carries.
func (ev *execEvent) result(pid int) *ExecResult {
	res := &ExecResult{PID: pid, Signal: ev.Signal, OOMKilled: ev.OOMKilled, TimedOut: ev.TimedOut,
		OutputTruncated: ev.Truncated, OutputDiscarded: ev.Discarded}
	if ev.ExitCode != nil {
		res.ExitCode = *ev.ExitCode
	}
	return res
}

// err returns the error an error event carries.
func (ev *execEvent) err() error {
	if ev.Error != nil {
		return &Error{Status: 200, Code: ev.Error.Code, Message: ev.Error.Message}
	}
	return &Error{Status: 200, Code: CodeInternal, Message: "stream failed without a reason"}
}

// Exec runs a process in a sandbox, streams its output to opts.Stdout and
// opts.Stderr, and returns how it ended. A process that cannot start is an
// error (code not_found for a missing executable); a non-zero exit is not.
func (c *Client) Exec(ctx context.Context, id string, opts ExecOptions) (*ExecResult, error) {
	b, err := json.Marshal(opts.request())
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readExec(newEventScanner(resp.Body), opts)
}

func (opts ExecOptions) request() execRequest {
	return execRequest{Cmd: opts.Cmd, Shell: opts.Shell, Env: opts.Env, Cwd: opts.Cwd, User: opts.User,
		Stdin: opts.Stdin, TimeoutMS: opts.Timeout.Milliseconds(), MaxOutput: opts.MaxOutputBytes}
}

// newEventScanner reads the lines of an event stream, each at most 16 MiB.
func newEventScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	return sc
}

// readExec reads exec events from sc up to the exit, writing the output
// to opts' writers, and returns how the process ended.
func readExec(sc *bufio.Scanner, opts ExecOptions) (*ExecResult, error) {
	pid := 0
	for sc.Scan() {
		var ev execEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decoding exec event: %w", err)
		}
		switch ev.Type {
		case "start":
			pid = ev.PID
		case "stdout", "stderr":
			w := opts.Stdout
			if ev.Type == "stderr" {
				w = opts.Stderr
			}
			if w != nil {
				if _, err := w.Write(ev.bytes()); err != nil {
					return nil, fmt.Errorf("writing %s: %w", ev.Type, err)
				}
			}
		case "exit":
			return ev.result(pid), nil
		case "error":
			return nil, ev.err()
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading exec stream: %w", err)
	}
	return nil, &Error{Code: CodeUnavailable, Message: "exec stream ended without an exit status"}
}

// UpdateOptions are new limits and lifecycle timers for a running or
// paused sandbox; zero fields keep their value. IdleTimeout, when not nil,
// is the new idle timeout (whole seconds; 0 turns it off). The deadline
// changes only through SetTimeout.
type UpdateOptions struct {
	CPUs        float64        `json:"cpus,omitempty"`
	MemoryMB    int64          `json:"memory_mb,omitempty"`
	Pids        int64          `json:"pids,omitempty"`
	IdleTimeout *time.Duration `json:"idle_timeout,omitempty"`
	OnDeadline  string         `json:"on_deadline,omitempty"`
	OnIdle      string         `json:"on_idle,omitempty"`
}

// MarshalJSON writes the request body, with IdleTimeout in seconds.
func (o UpdateOptions) MarshalJSON() ([]byte, error) {
	type plain UpdateOptions // without this method
	v := struct {
		plain
		IdleTimeout *int64 `json:"idle_timeout,omitempty"`
	}{plain: plain(o)}
	if o.IdleTimeout != nil {
		v.IdleTimeout = seconds(*o.IdleTimeout)
	}
	return json.Marshal(v)
}

// Update changes a sandbox's CPU, memory and pids limits while it runs,
// and its idle timeout and timer actions.
func (c *Client) Update(ctx context.Context, id string, opts UpdateOptions) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "PATCH", "/v1/sandboxes/"+url.PathEscape(id), nil, opts, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
