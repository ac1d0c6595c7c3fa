package sandbox

import (
	"context"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/wire"
)

// Spec is what a caller asks for when creating a sandbox. Zero resource
// fields take the Manager's defaults.
type Spec struct {
	Template string
	// Runtime names a driver ("runc", later "gvisor", "qemu"); empty means
	// the Manager's default.
	Runtime     string
	MilliCPUs   int64
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64
	// Timeout is the lifetime from creation. Nil takes the default; a
	// pointer to 0 means no deadline (allowed only when the Manager has no
	// maximum).
	Timeout  *time.Duration
	Env      map[string]string
	Metadata map[string]string
	// Network is what the sandbox may reach. An empty Mode means
	// allowlist when the policy has rules and the Manager's default mode
	// otherwise.
	Network egress.Policy
	// Pool names a warm pool to claim from (pool.go); empty claims from a
	// pool whose shape equals the spec's, if any.
	Pool string
	// IdleTimeout, when positive, fires OnIdle after that long without
	// exec, file or PTY activity (lifecycle.go). OnDeadline and OnIdle
	// are ActionDestroy when empty.
	IdleTimeout time.Duration
	OnDeadline  Action
	OnIdle      Action
	// FromSnapshot names a snapshot to start from: its template, runtime,
	// limits and environment are the defaults, and the sandbox starts with
	// its files (and, for a memory snapshot, its processes).
	FromSnapshot string
	// Mounts are host directories the sandbox sees (mounts.go).
	Mounts []Mount
}

// Sandbox is the Manager's record of one sandbox, as persisted in the store.
type Sandbox struct {
	ID          string            `json:"id"`
	Template    string            `json:"template"`
	Runtime     string            `json:"runtime"`
	State       State             `json:"state"`
	MilliCPUs   int64             `json:"milli_cpus"`
	MemoryBytes int64             `json:"memory_bytes"`
	Pids        int64             `json:"pids"`
	DiskBytes   int64             `json:"disk_bytes,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	// Deadline is when the sandbox is destroyed; zero means never. It
	// changes only through an explicit SetTimeout.
	Deadline time.Time `json:"deadline,omitzero"`
	// Error says why a sandbox is in StateError.
	Error string `json:"error,omitempty"`
	// Tenant owns the sandbox (tenancy.Owner of its creator; "" is the
	// operator's): other tenants neither see nor touch it.
	Tenant string `json:"tenant,omitempty"`
	// Key names the API key the sandbox was created with
	// (tenancy.Principal.Key; "" for the unix socket and the daemon), so
	// that calls made with the sandbox's own credentials, such as the E2B
	// envd access token, are on record under that key.
	Key string `json:"key,omitempty"`
	// Owner is the principal the sandbox was created for (admission.WithPrincipal),
	// so that per-principal limits hold across a restart. It names an API
	// key by digest only.
	Owner string `json:"owner,omitempty"`
	// Network is the sandbox's current network policy, normalized. It
	// holds the values of injected headers: show it through a redacting
	// view only. A record without a Mode ran in the runtime's own
	// namespace (managedNetwork).
	Network egress.Policy `json:"network,omitzero"`
	// Mounts are the host directories the sandbox sees, shallower
	// targets first.
	Mounts []Mount `json:"mounts,omitempty"`
	// Pool names the warm pool that holds the sandbox until a create
	// claims it; claimed and ordinary sandboxes have none. Pool members
	// are hidden from users (see pool.go).
	Pool string `json:"pool,omitempty"`
	// IdleTimeout, OnDeadline and OnIdle are the sandbox's lifecycle
	// timers (lifecycle.go).
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	OnDeadline  Action        `json:"on_deadline,omitempty"`
	OnIdle      Action        `json:"on_idle,omitempty"`
}

// clone returns a deep copy, so callers never share maps with the Manager.
func (s Sandbox) clone() Sandbox {
	s.Env = cloneMap(s.Env)
	s.Metadata = cloneMap(s.Metadata)
	s.Network = clonePolicy(s.Network)
	return s
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Template is the record of one template tree in storage.
type Template struct {
	Name string `json:"name"`
	// Tenant owns the template (tenancy.Owner of its maker): "" is the
	// operator's, which every tenant sees and uses; a tenant's is its own
	// (and the admins'). Names are one namespace for all tenants.
	Tenant    string    `json:"tenant,omitempty"`
	Source    string    `json:"source"` // "import", "debian", "busybox", "pull", "build"
	CreatedAt time.Time `json:"created_at"`
	// Image is the image the tree came from (the reference pulled, or the
	// FROM of a build; empty for an imported archive) and Digest its
	// manifest digest; the image cache keeps the image's blobs while a
	// template names it.
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
	// BuildKeys are the build cache keys of the steps that made the
	// tree; the build cache keeps their results while the template exists,
	// so a rebuild reuses them.
	BuildKeys []string `json:"build_keys,omitempty"`
	// Defaults say how processes run in the template's sandboxes (from the
	// image configuration); nil for trees not made from an image.
	Defaults *Defaults `json:"defaults,omitempty"`
	// Service, if set, is started in every new sandbox of the template,
	// which is running only once the service is ready.
	Service *Service `json:"service,omitempty"`
	// ReadySnapshots name, by runtime, the template's ready snapshots
	// (ready.go): memory snapshots of a new sandbox of the template, taken
	// once its service was ready, that new sandboxes start from.
	ReadySnapshots map[string]string `json:"ready_snapshots,omitempty"`
}

// Service is a template's start command, how it is restarted and when
// it is ready. It runs with the template's Defaults (environment, working
// directory, user), supervised by the sandbox's agent.
type Service struct {
	// Cmd or Shell is the start command.
	Cmd   []string `json:"cmd,omitempty"`
	Shell string   `json:"shell,omitempty"`
	// Restart is a wire.Restart policy; empty means wire.RestartNever.
	Restart string `json:"restart,omitempty"`
	// Ready is the check that gates "running"; nil means ready once the
	// command started.
	Ready *wire.ReadyCheck `json:"ready,omitempty"`
	// ReadyTimeoutMS bounds the wait for readiness; 0 means the server's
	// default.
	ReadyTimeoutMS int64 `json:"ready_timeout_ms,omitempty"`
}

// Filter selects sandboxes in List. Zero fields match everything.
type Filter struct {
	State    State
	Metadata map[string]string
	// Pooled includes unclaimed warm pool members, which are left out
	// otherwise.
	Pooled bool
}

func (f Filter) match(s Sandbox) bool {
	if s.Pool != "" && !f.Pooled {
		return false
	}
	if f.State != 0 && s.State != f.State {
		return false
	}
	for k, v := range f.Metadata {
		if got, ok := s.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Store persists sandboxes and templates. Put and Delete must be durable
// when they return: the Manager starts a sandbox's instance only once its
// record is in, so that after a crash reconcile knows every instance it
// must keep.
type Store interface {
	PutSandbox(ctx context.Context, s Sandbox) error
	DeleteSandbox(ctx context.Context, id string) error
	Sandboxes(ctx context.Context) ([]Sandbox, error)
	PutTemplate(ctx context.Context, t Template) error
	DeleteTemplate(ctx context.Context, name string) error
	Templates(ctx context.Context) ([]Template, error)
}
