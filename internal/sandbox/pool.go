package sandbox

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
)

// Warm pools keep sandboxes of one shape (template, runtime, limits and
// network class) created and running, so that a create of that shape only
// hands one out: it pings the agent, applies the create's network policy,
// lower limits, environment, metadata and timers, and returns. A miss is
// an ordinary cold create.
//
// Pool members are hidden: List leaves them out (unless Filter.Pooled),
// and Get, Exec, files and processes answer not found, so no one can leave
// anything in a sandbox that a later claim gets. They have no deadline and
// no idle timeout until claimed; a claimed sandbox gets its deadline from
// the claim. A sandbox is never returned to a pool: deleting a claimed
// sandbox destroys it.
//
// Definitions are kept in the store (PoolStore). After a restart, members
// that are still running are adopted once their agent answers a ping; all
// others are deleted.

// MaxPoolSize bounds the size of one pool.
const MaxPoolSize = 256

// Pool is the definition of a warm pool.
type Pool struct {
	Name        string `json:"name"`
	Template    string `json:"template"`
	Runtime     string `json:"runtime"`
	MilliCPUs   int64  `json:"milli_cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	Pids        int64  `json:"pids"`
	DiskBytes   int64  `json:"disk_bytes,omitempty"`
	// Network is the network mode members are made with (no rules). A
	// claim matches a pool of mode none only when it asks for none, and a
	// pool of another mode only when it does not; the claim's policy
	// replaces the member's (UpdateNetwork).
	Network egress.Mode `json:"network"`
	// Size is how many ready members the pool keeps.
	Size int `json:"size"`
}

// sameShape reports whether members made for p fit q.
func (p Pool) sameShape(q Pool) bool {
	p.Size, q.Size = 0, 0
	return p == q
}

// PoolStatus is a pool's definition and its members.
type PoolStatus struct {
	Pool
	// Ready members can be claimed; Filling ones are being made (or, after
	// a restart, checked).
	Ready   int `json:"ready"`
	Filling int `json:"filling"`
	// Error is the last refill failure while refills back off until
	// RetryAt.
	Error   string    `json:"error,omitempty"`
	RetryAt time.Time `json:"retry_at,omitzero"`
}

// PoolStore persists pool definitions. The Manager's Store must implement
// it for pools to be defined.
type PoolStore interface {
	PutPool(ctx context.Context, p Pool) error
	DeletePool(ctx context.Context, name string) error
	Pools(ctx context.Context) ([]Pool, error)
}

// pools is the Manager's set of warm pools; everything is guarded by mu.
type pools struct {
	mu       sync.Mutex
	m        map[string]*pool
	kick     chan struct{} // wakes poolLoop
	inflight int           // members being made, over all pools
	adopt    []adoption    // members found at Start, for poolLoop to ping
}

type pool struct {
	def Pool
	// gen changes with the shape; members made for an older one are
	// dropped when they are done.
	gen      int
	ready    []string // member IDs, oldest first
	filling  int
	fills    sync.WaitGroup // fill goroutines of this pool
	failures int
	retryAt  time.Time
	// refillAt is when a claim's replacement may start (PoolRefillDelay).
	refillAt time.Time
	lastErr  string
}

// memberShape is the pool shape of member sb.
func memberShape(sb Sandbox) Pool {
	return Pool{Name: sb.Pool, Template: sb.Template, Runtime: sb.Runtime, MilliCPUs: sb.MilliCPUs,
		MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes, Network: sb.Network.Mode}
}

// SetPool defines pool def or changes it, records it, and returns its
// status. Zero limits take the Manager's defaults, an empty runtime the
// default runtime, an empty network mode the default mode. Members of an
// older shape, and ready members beyond a smaller size, are deleted before
// it returns; new members are made in the background. The store must
// implement PoolStore. Pools are shared by every tenant, and so are their
// templates: a pool of a tenant's template is refused, so that no pool
// shows or hands out a tenant's template to another.
func (m *Manager) SetPool(ctx context.Context, def Pool) (PoolStatus, error) {
	if err := ValidateTemplateName(def.Name); err != nil {
		return PoolStatus{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid pool name %q: use lower-case letters, digits, '.', '_' and '-'", def.Name)
	}
	if err := RangePoolSize.Check(int64(def.Size)); err != nil {
		return PoolStatus{}, err
	}
	ps, ok := m.cfg.Store.(PoolStore)
	if !ok {
		return PoolStatus{}, errdefs.Errorf(errdefs.ErrNotImplemented, "this daemon's store cannot keep pools")
	}
	// Check the shape the way a member's create would.
	sb, _, err := m.admit(ctx, Spec{Template: def.Template, Runtime: def.Runtime, MilliCPUs: def.MilliCPUs,
		MemoryBytes: def.MemoryBytes, Pids: def.Pids, DiskBytes: def.DiskBytes, Network: egress.Policy{Mode: def.Network}})
	if err != nil {
		return PoolStatus{}, err
	}
	m.mu.RLock()
	owner := m.templates[sb.Template].Tenant
	m.mu.RUnlock()
	if owner != "" {
		return PoolStatus{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q belongs to a tenant: pools are shared by every tenant and hold the operator's templates only", sb.Template)
	}
	def = Pool{Name: def.Name, Template: sb.Template, Runtime: sb.Runtime, MilliCPUs: sb.MilliCPUs,
		MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes, Network: sb.Network.Mode, Size: def.Size}
	if err := ps.PutPool(ctx, def); err != nil {
		return PoolStatus{}, fmt.Errorf("recording pool %s: %w", def.Name, err)
	}
	m.pools.mu.Lock()
	p := m.pools.m[def.Name]
	var drop []string
	if p == nil {
		p = &pool{def: def}
		m.pools.m[def.Name] = p
	} else {
		if !p.def.sameShape(def) {
			p.gen++
			drop, p.ready = p.ready, nil
		}
		if len(p.ready) > def.Size {
			drop = append(drop, p.ready[def.Size:]...)
			p.ready = p.ready[:def.Size]
		}
		p.def = def
	}
	p.failures, p.lastErr, p.retryAt = 0, "", time.Time{}
	st := p.status()
	m.pools.mu.Unlock()
	m.deleteMembers(context.WithoutCancel(ctx), drop)
	m.kickPools()
	m.log.Info("pool set", "pool", def.Name, "template", def.Template, "runtime", def.Runtime, "size", def.Size)
	return st, nil
}

// status returns p's status; the caller holds pools.mu.
func (p *pool) status() PoolStatus {
	return PoolStatus{Pool: p.def, Ready: len(p.ready), Filling: p.filling, Error: p.lastErr, RetryAt: p.retryAt}
}

// checkNoPoolUses returns an error wrapping errdefs.ErrFailedPrecondition
// when a pool makes sandboxes of template name.
func (m *Manager) checkNoPoolUses(template string) error {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	var names []string
	for n, p := range m.pools.m {
		if p.def.Template == template {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q is used by pool(s) %s: remove them first", template, strings.Join(names, ", "))
}

// RemovePool deletes pool name and its members before it returns (members
// still being made are waited for).
func (m *Manager) RemovePool(ctx context.Context, name string) error {
	m.pools.mu.Lock()
	p := m.pools.m[name]
	if p == nil {
		m.pools.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrNotFound, "pool %q not found", name)
	}
	delete(m.pools.m, name)
	drop := p.ready
	p.ready = nil
	m.pools.mu.Unlock()
	if ps, ok := m.cfg.Store.(PoolStore); ok {
		if err := ps.DeletePool(ctx, name); err != nil {
			return fmt.Errorf("forgetting pool %s: %w", name, err)
		}
	}
	m.deleteMembers(context.WithoutCancel(ctx), drop)
	p.fills.Wait()
	m.log.Info("pool removed", "pool", name)
	return nil
}

// Pools lists the pools by name.
func (m *Manager) Pools() []PoolStatus {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	out := make([]PoolStatus, 0, len(m.pools.m))
	for _, p := range m.pools.m {
		out = append(out, p.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PoolStatus returns one pool.
func (m *Manager) PoolStatus(name string) (PoolStatus, error) {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	p := m.pools.m[name]
	if p == nil {
		return PoolStatus{}, errdefs.Errorf(errdefs.ErrNotFound, "pool %q not found", name)
	}
	return p.status(), nil
}
