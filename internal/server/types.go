package server

import (
	"time"

	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/wire"
)

// SandboxView is a sandbox as the API shows it. Environment values and
// injected header values are not shown: they may hold secrets.
type SandboxView struct {
	ID       string            `json:"id"`
	Template string            `json:"template"`
	Runtime  string            `json:"runtime"`
	State    string            `json:"state"`
	CPUs     float64           `json:"cpus"`
	MemoryMB int64             `json:"memory_mb"`
	Pids     int64             `json:"pids"`
	DiskMB   int64             `json:"disk_mb,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Tenant owns the sandbox; "" is the operator.
	Tenant    string         `json:"tenant,omitempty"`
	CreatedAt time.Time      `json:"created_at"`
	Deadline  *time.Time     `json:"deadline,omitempty"`
	Error     string         `json:"error,omitempty"`
	Network   *NetworkPolicy `json:"network,omitempty"`
	// Mounts are the host directories the sandbox sees, targets' parents
	// first.
	Mounts []Mount `json:"mounts,omitempty"`
	// IdleTimeout (seconds), OnDeadline and OnIdle are the lifecycle
	// timers (0: no idle timeout).
	IdleTimeout int64  `json:"idle_timeout,omitempty"`
	OnDeadline  string `json:"on_deadline,omitempty"`
	OnIdle      string `json:"on_idle,omitempty"`
}

// views maps every element of list to its API view.
func views[T, V any](list []T, view func(T) V) []V {
	out := make([]V, len(list))
	for i, x := range list {
		out[i] = view(x)
	}
	return out
}

func viewOf(sb sandbox.Sandbox) SandboxView {
	v := SandboxView{
		ID:        sb.ID,
		Template:  sb.Template,
		Runtime:   sb.Runtime,
		State:     sb.State.String(),
		CPUs:      float64(sb.MilliCPUs) / 1000,
		MemoryMB:  sb.MemoryBytes >> 20,
		Pids:      sb.Pids,
		DiskMB:    sb.DiskBytes >> 20,
		Metadata:  sb.Metadata,
		Tenant:    sb.Tenant,
		CreatedAt: sb.CreatedAt,
		Error:     sb.Error,
		Network:   networkView(sb.Network),
		Mounts:    mountViews(sb.Mounts),

		IdleTimeout: int64(sb.IdleTimeout / time.Second),
		OnDeadline:  string(sb.OnDeadline),
		OnIdle:      string(sb.OnIdle),
	}
	if !sb.Deadline.IsZero() {
		d := sb.Deadline
		v.Deadline = &d
	}
	return v
}

// CreateRequest is the body of POST /v1/sandboxes. Omitted resources take
// the server's defaults. Timeout is in seconds: omitted means the server
// default, 0 means no deadline (if the server allows it).
type CreateRequest struct {
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
	// Pool names a warm pool to claim from; without it a pool of the
	// request's shape is used when one has a sandbox ready.
	Pool string `json:"pool,omitempty"`
	// IdleTimeout (seconds, 0: none) fires OnIdle after that long without
	// exec, file or PTY activity; OnDeadline and OnIdle are "destroy"
	// (default), "pause" or "stop".
	IdleTimeout int64  `json:"idle_timeout,omitempty"`
	OnDeadline  string `json:"on_deadline,omitempty"`
	OnIdle      string `json:"on_idle,omitempty"`
	// FromSnapshot starts the sandbox from a snapshot; template, runtime,
	// limits and environment default to the snapshot's.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Mounts are host directories the sandbox sees.
	Mounts []Mount `json:"mounts,omitempty"`
}

// spec checks r and returns the sandbox spec it asks for.
func (r CreateRequest) spec() (sandbox.Spec, error) {
	var f fields
	s := sandbox.Spec{
		FromSnapshot: r.FromSnapshot,
		Template:     r.Template,
		Runtime:      r.Runtime,
		MilliCPUs:    f.cpus(r.CPUs),
		MemoryBytes:  f.opt(sandbox.RangeMemory, r.MemoryMB),
		Pids:         f.opt(sandbox.RangePids, r.Pids),
		DiskBytes:    f.opt(sandbox.RangeDisk, r.DiskMB),
		Timeout:      f.seconds(sandbox.RangeTimeout, r.Timeout),
		Env:          r.Env,
		Metadata:     r.Metadata,
		Pool:         r.Pool,
		IdleTimeout:  time.Duration(f.opt(sandbox.RangeIdleTimeout, r.IdleTimeout)),
		OnDeadline:   sandbox.Action(r.OnDeadline),
		OnIdle:       sandbox.Action(r.OnIdle),
		Mounts:       specMounts(r.Mounts),
	}
	if f.err != nil {
		return sandbox.Spec{}, f.err
	}
	var err error
	if s.Network, err = r.Network.policy(false); err != nil {
		return sandbox.Spec{}, err
	}
	return s, nil
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout: the new
// deadline is now + Timeout seconds (0: no deadline, if allowed).
type TimeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

// BuildRequest is the body of POST /v1/templates/{name}/build.
type BuildRequest struct {
	// Recipe is "debian" (debootstrap; a coding-agent userland),
	// "code-interpreter" (debian with Jupyter's Python kernel, numpy,
	// pandas and matplotlib, and the code interpreter as its service) or
	// "busybox" (a 2 MB rootfs, for tests).
	Recipe         string `json:"recipe"`
	Mirror         string `json:"mirror,omitempty"`
	BuildEssential bool   `json:"build_essential,omitempty"`
	// Service, if set, is the template's service.
	Service *sandbox.Service `json:"service,omitempty"`
}

// BuildEvent is one line of a template build or pull stream.
type BuildEvent struct {
	Type     string             `json:"type"` // "log", "progress", "done" or "error"
	Text     string             `json:"text,omitempty"`
	Progress *ociimage.Progress `json:"progress,omitempty"`
	Template *sandbox.Template  `json:"template,omitempty"`
	Error    *errorDetail       `json:"error,omitempty"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Health is the body of GET /v1/health.
type Health struct {
	// OK is false while the daemon serves requests but does not keep a
	// promise; Problems then says which.
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
	// DiskQuota is the state of disk limit accounting, for storage that
	// enforces disk limits.
	DiskQuota *storage.QuotaStatus `json:"disk_quota,omitempty"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version  string                `json:"version"`
	Storage  string                `json:"storage"`
	Runtimes []sandbox.RuntimeInfo `json:"runtimes"`
}

// AttachControl is a text message from the client of a WebSocket attach:
// {"type":"resize","cols":120,"rows":40}, {"type":"signal","signal":"SIGINT"}
// or {"type":"close_stdin"}.
type AttachControl struct {
	Type   string `json:"type"`
	Cols   uint16 `json:"cols,omitempty"`
	Rows   uint16 `json:"rows,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// AttachEvent is a text message to the client of a WebSocket attach:
// "start" first (PID, and Dropped bytes that were no longer buffered),
// "exit" last (the exit status, after which the server closes the
// connection with status 1000), and "error" when a control message, stdin
// or the output stream failed.
type AttachEvent struct {
	Type     string            `json:"type"`
	PID      int               `json:"pid,omitempty"`
	Dropped  int64             `json:"dropped,omitempty"`
	ExitCode *int              `json:"exit_code,omitempty"`
	Signal   string            `json:"signal,omitempty"`
	TimedOut bool              `json:"timed_out,omitempty"`
	Error    *wire.ErrorDetail `json:"error,omitempty"`
}

// CodeRequest is the body of POST /v1/sandboxes/{id}/code: code to run
// on a context of the sandbox's code interpreter. ContextID and Language
// are exclusive; neither means the default Python context.
type CodeRequest struct {
	Code      string `json:"code"`
	ContextID string `json:"context_id,omitempty"`
	// Language is python (the default), javascript or bash; the default
	// context of that language runs the code.
	Language string            `json:"language,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// TimeoutMS, if not 0, interrupts the execution after this long; the
	// context stays usable.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes bounds the stdout and stderr sent (0: the
	// interpreter's default, 8 MiB); past it output is dropped.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// Code event types, beside "stdout", "stderr" and "error" (the stream
// failed), which mean what they mean for exec.
const (
	CodeEventResult    = "result"
	CodeEventException = "exception"
	CodeEventEnd       = "end"
)

// CodeEvent is one line of a code execution stream: stdout and stderr
// (Text), result (Result, whose fields are E2B's: text, html, markdown,
// png, jpeg, svg, pdf, latex, json, javascript, data, chart, extra; Main
// for the value of the last expression), exception (the code raised), end
// (always last after a started execution) and error (the stream failed;
// no end follows).
type CodeEvent struct {
	Type      string         `json:"type"`
	Text      string         `json:"text,omitempty"`
	Result    map[string]any `json:"result,omitempty"`
	Main      bool           `json:"main,omitempty"`
	Exception *CodeException `json:"exception,omitempty"`
	// End fields.
	ExecutionCount  int   `json:"execution_count,omitempty"`
	TimedOut        bool  `json:"timed_out,omitempty"`
	OutputTruncated bool  `json:"output_truncated,omitempty"`
	OutputDiscarded int64 `json:"output_discarded,omitempty"`
	// Error is set on "error".
	Error *wire.ErrorDetail `json:"error,omitempty"`
}

// CodeException is an error the executed code raised (or a kernel that
// died: DeadKernelError).
type CodeException struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CodeContextRequest is the body of POST /v1/sandboxes/{id}/code/contexts.
type CodeContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}
