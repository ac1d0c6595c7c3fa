package sandbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
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

type adoption struct {
	p  *pool
	id string
}

// poolBackoff is how long refills of a pool wait after n failures in a
// row: 1s, doubling, at most a minute.
func poolBackoff(n int) time.Duration {
	d := time.Second
	for i := 1; i < n && d < time.Minute; i++ {
		d *= 2
	}
	return min(d, time.Minute)
}

// loadPools reads the pool definitions and sorts the members reconcile
// kept: those of a defined pool of the same shape that are running are
// queued for adoption by poolLoop; all others are deleted. Called by
// Start.
func (m *Manager) loadPools(ctx context.Context) error {
	m.pools.m = map[string]*pool{}
	m.pools.kick = make(chan struct{}, 1)
	if ps, ok := m.cfg.Store.(PoolStore); ok {
		defs, err := ps.Pools(ctx)
		if err != nil {
			return fmt.Errorf("loading pools: %w", err)
		}
		for _, def := range defs {
			m.pools.m[def.Name] = &pool{def: def}
		}
	}
	var drop []string
	for id, e := range m.sandboxes {
		if e.sb.Pool == "" {
			continue
		}
		p := m.pools.m[e.sb.Pool]
		if p == nil || e.sb.State != StateRunning || !p.def.sameShape(memberShape(e.sb)) {
			drop = append(drop, id)
			continue
		}
		p.filling++
		p.fills.Add(1)
		m.pools.adopt = append(m.pools.adopt, adoption{p, id})
	}
	for _, id := range drop {
		m.log.Info("deleting warm pool member of no pool", "sandbox_id", id)
		if err := m.Delete(ctx, id); err != nil {
			return fmt.Errorf("deleting warm pool member %s: %w", id, err)
		}
	}
	return nil
}

// memberShape is the pool shape of member sb.
func memberShape(sb Sandbox) Pool {
	return Pool{Name: sb.Pool, Template: sb.Template, Runtime: sb.Runtime, MilliCPUs: sb.MilliCPUs,
		MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes, Network: sb.Network.Mode}
}

// poolLoop adopts the members found at Start and keeps pools filled until
// Close, which cancels the creates in flight and waits for them.
func (m *Manager) poolLoop() {
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	m.pools.mu.Lock()
	adopt := m.pools.adopt
	m.pools.adopt = nil
	m.pools.mu.Unlock()
	for _, a := range adopt {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.adopt(ctx, a)
		}()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		m.refill(ctx, &wg)
		select {
		case <-m.stop:
			return
		case <-m.pools.kick:
		case <-t.C:
		}
	}
}

func (m *Manager) kickPools() {
	select {
	case m.pools.kick <- struct{}{}:
	default:
	}
}

// adopt makes a member found at Start ready once its agent answers, and
// deletes it otherwise.
func (m *Manager) adopt(ctx context.Context, a adoption) {
	defer a.p.fills.Done()
	err := m.ping(ctx, a.id, 10*time.Second)
	m.pools.mu.Lock()
	a.p.filling--
	keep := err == nil && m.pools.m[a.p.def.Name] == a.p && len(a.p.ready) < a.p.def.Size
	if keep {
		a.p.ready = append(a.p.ready, a.id)
	}
	m.pools.mu.Unlock()
	if keep {
		m.log.Info("adopted warm pool member", "sandbox_id", a.id, "pool", a.p.def.Name)
		return
	}
	m.log.Info("deleting warm pool member after restart", "sandbox_id", a.id, "pool", a.p.def.Name, "err", err)
	m.deleteMembers(context.WithoutCancel(ctx), []string{a.id})
	m.kickPools()
}

// ping checks that sandbox id's agent answers within timeout.
func (m *Manager) ping(ctx context.Context, id string, timeout time.Duration) error {
	m.mu.RLock()
	e, ok := m.sandboxes[id]
	var state State
	if ok {
		state = e.sb.State
	}
	m.mu.RUnlock()
	if !ok || state != StateRunning || e.agent == nil {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is not running", id)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := e.agent.Health(ctx); err != nil {
		return fmt.Errorf("pinging agent of sandbox %s: %w", id, err)
	}
	return nil
}

// poolConcurrency bounds the members being made at once, over all pools:
// a refill must not starve the cold creates of a 2-core machine.
func (m *Manager) poolConcurrency() int {
	if m.cfg.PoolConcurrency > 0 {
		return m.cfg.PoolConcurrency
	}
	return 2
}

// refill starts making members for pools below their size that are not
// backing off, within the concurrency bound.
func (m *Manager) refill(ctx context.Context, wg *sync.WaitGroup) {
	now := m.cfg.Now()
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	names := make([]string, 0, len(m.pools.m))
	for n := range m.pools.m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := m.pools.m[n]
		if now.Before(p.retryAt) || now.Before(p.refillAt) {
			continue
		}
		for len(p.ready)+p.filling < p.def.Size && m.pools.inflight < m.poolConcurrency() {
			p.filling++
			m.pools.inflight++
			wg.Add(1)
			p.fills.Add(1)
			go func(def Pool, gen int) {
				defer wg.Done()
				defer p.fills.Done()
				m.fill(ctx, p, def, gen)
			}(p.def, p.gen)
		}
	}
}

// fill makes one member of pool p (definition def, generation gen) and
// adds it to the ready ones, unless the pool changed meanwhile.
func (m *Manager) fill(ctx context.Context, p *pool, def Pool, gen int) {
	id, err := m.makeMember(ctx, def)
	m.pools.mu.Lock()
	m.pools.inflight--
	p.filling--
	current := m.pools.m[def.Name] == p && p.gen == gen
	keep := err == nil && current && len(p.ready) < p.def.Size
	switch {
	case keep:
		p.ready = append(p.ready, id)
		p.failures, p.lastErr, p.retryAt = 0, "", time.Time{}
	case err != nil && current && ctx.Err() == nil:
		p.failures++
		p.lastErr = err.Error()
		p.retryAt = m.cfg.Now().Add(poolBackoff(p.failures))
	}
	m.pools.mu.Unlock()
	if err == nil && !keep {
		m.deleteMembers(context.WithoutCancel(ctx), []string{id})
	}
	m.kickPools()
}

// makeMember creates a sandbox for pool def and waits until its agent
// answers. It logs why it failed, unless create did.
func (m *Manager) makeMember(ctx context.Context, def Pool) (string, error) {
	sb, drv, err := m.admit(Spec{Template: def.Template, Runtime: def.Runtime, MilliCPUs: def.MilliCPUs,
		MemoryBytes: def.MemoryBytes, Pids: def.Pids, DiskBytes: def.DiskBytes, Network: egress.Policy{Mode: def.Network}})
	if err != nil {
		m.log.Warn("refilling warm pool", "pool", def.Name, "err", err)
		return "", err
	}
	sb.Pool, sb.Deadline = def.Name, time.Time{}
	sb, err = m.create(ctx, sb, drv, nil, nil)
	if err != nil {
		return "", err
	}
	if err := m.ping(ctx, sb.ID, 10*time.Second); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("refilling warm pool", "pool", def.Name, "sandbox_id", sb.ID, "err", err)
		}
		m.deleteMembers(context.WithoutCancel(ctx), []string{sb.ID})
		return "", err
	}
	return sb.ID, nil
}

// deleteMembers destroys pool members, logging failures (a member that
// cannot be deleted is in state error and deleted again after a restart).
func (m *Manager) deleteMembers(ctx context.Context, ids []string) {
	for _, id := range ids {
		if err := m.Delete(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Error("deleting warm pool member", "sandbox_id", id, "err", err)
		}
	}
}

// SetPool defines pool def or changes it, records it, and returns its
// status. Zero limits take the Manager's defaults, an empty runtime the
// default runtime, an empty network mode the default mode. Members of an
// older shape, and ready members beyond a smaller size, are deleted before
// it returns; new members are made in the background. The store must
// implement PoolStore.
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
	sb, _, err := m.admit(Spec{Template: def.Template, Runtime: def.Runtime, MilliCPUs: def.MilliCPUs,
		MemoryBytes: def.MemoryBytes, Pids: def.Pids, DiskBytes: def.DiskBytes, Network: egress.Policy{Mode: def.Network}})
	if err != nil {
		return PoolStatus{}, err
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

// claim hands out a warm sandbox for spec when a pool fits it (see the
// comment at the top of this file). It returns claimed false, and spec
// completed from the pool named in spec.Pool, when Create must make the
// sandbox cold. Errors are those of the spec.
func (m *Manager) claim(ctx context.Context, spec Spec) (Spec, Sandbox, bool, error) {
	m.pools.mu.Lock()
	none := len(m.pools.m) == 0
	var named *Pool
	if p := m.pools.m[spec.Pool]; p != nil {
		named = &p.def
	}
	m.pools.mu.Unlock()
	if spec.Pool == "" && none {
		return spec, Sandbox{}, false, nil
	}
	if spec.Pool != "" {
		if named == nil {
			return spec, Sandbox{}, false, errdefs.Errorf(errdefs.ErrNotFound, "pool %q not found", spec.Pool)
		}
		var err error
		if spec, err = fitPool(spec, *named); err != nil {
			return spec, Sandbox{}, false, err
		}
	}
	want, _, err := m.admit(spec)
	if err != nil {
		return spec, Sandbox{}, false, err
	}
	if spec.Pool != "" && (want.Network.Mode == egress.ModeNone) != (named.Network == egress.ModeNone) {
		return spec, Sandbox{}, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "pool %q has network mode %s and cannot serve mode %s", spec.Pool, named.Network, want.Network.Mode)
	}
	// The caller's own limit applies to a claim as to a cold create.
	want.Owner = principalOf(ctx)
	start := time.Now()
	for {
		if err := m.adm.reserveKey(want.Owner); err != nil {
			m.logFailedCreate(ctx, Sandbox{Runtime: want.Runtime, Template: want.Template}, time.Since(start), err)
			return spec, Sandbox{}, false, err
		}
		id, pool := m.takeMember(want, spec.Pool)
		if id == "" {
			m.adm.unreserveKey(want.Owner)
			m.met.PoolMisses.Inc()
			return spec, Sandbox{}, false, nil
		}
		m.adm.assign(id, want.Owner)
		sb, err := m.handOut(ctx, id, want)
		if err == nil {
			m.met.PoolHits.Inc()
			m.met.ClaimSeconds.Observe(time.Since(start).Seconds(), sb.Runtime)
			m.log.Info("sandbox claimed from pool", "sandbox_id", id, "pool", pool)
			return spec, sb, true, nil
		}
		m.log.Warn("warm pool member unusable; trying the next", "sandbox_id", id, "err", err)
		m.deleteMembers(context.WithoutCancel(ctx), []string{id})
	}
}

// fitPool completes spec from pool def, which it names: the template and
// runtime must be the pool's or empty, limits at most the pool's (zero
// takes the pool's), the disk limit the pool's.
func fitPool(spec Spec, def Pool) (Spec, error) {
	for _, f := range []struct{ name, v, pool string }{{"template", spec.Template, def.Template}, {"runtime", spec.Runtime, def.Runtime}} {
		if f.v != "" && f.v != f.pool {
			return spec, errdefs.Errorf(errdefs.ErrInvalidArgument, "pool %q has %s %q, not %q", def.Name, f.name, f.pool, f.v)
		}
	}
	spec.Template, spec.Runtime = def.Template, def.Runtime
	for _, f := range []struct {
		name  string
		v     *int64
		limit int64
	}{
		{"cpus (millicpus)", &spec.MilliCPUs, def.MilliCPUs},
		{"memory (bytes)", &spec.MemoryBytes, def.MemoryBytes},
		{"pids", &spec.Pids, def.Pids},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.limit
		case f.limit > 0 && *f.v > f.limit:
			return spec, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %d exceeds the shape of pool %q (%d)", f.name, *f.v, def.Name, f.limit)
		}
	}
	if spec.DiskBytes != 0 && spec.DiskBytes != def.DiskBytes {
		return spec, errdefs.Errorf(errdefs.ErrInvalidArgument, "disk limit %d differs from the shape of pool %q (%d)", spec.DiskBytes, def.Name, def.DiskBytes)
	}
	spec.DiskBytes = def.DiskBytes
	return spec, nil
}

// takeMember removes a ready member from a pool that fits want (the pool
// named, or one of want's shape) and returns its ID and the pool's name,
// or "" when none is ready. Either way the pool is refilled.
func (m *Manager) takeMember(want Sandbox, name string) (id, pool string) {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	shape := memberShape(want)
	for _, p := range m.pools.m {
		fits := p.def.Name == name
		if name == "" {
			shape.Name, shape.Network = p.def.Name, p.def.Network
			fits = p.def.sameShape(shape) && (want.Network.Mode == egress.ModeNone) == (p.def.Network == egress.ModeNone)
		}
		if !fits || len(p.ready) == 0 {
			continue
		}
		id = p.ready[0]
		p.ready = slices.Delete(p.ready, 0, 1)
		if d := m.cfg.PoolRefillDelay; d > 0 {
			// Measured on 2 cores: a replacement made at once (runc run
			// or runsc, tens to hundreds of ms of CPU) doubles the
			// claim's time to first output (docs/BENCHMARKS.md).
			p.refillAt = m.cfg.Now().Add(d)
			time.AfterFunc(d, m.kickPools)
		} else {
			m.kickPools()
		}
		return id, p.def.Name
	}
	m.kickPools()
	return "", ""
}

// handOut turns member id into the sandbox want describes: it pings the
// agent, applies want's network policy and lower limits, then its
// environment, metadata, timers and deadline, and records it as claimed.
// On error the member is left for the caller to delete.
func (m *Manager) handOut(ctx context.Context, id string, want Sandbox) (Sandbox, error) {
	if err := m.ping(ctx, id, 2*time.Second); err != nil {
		return Sandbox{}, err
	}
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.RLock()
	have := e.sb.clone()
	m.mu.RUnlock()
	if !reflect.DeepEqual(have.Network, want.Network) {
		if _, err := m.UpdateNetwork(ctx, id, want.Network); err != nil {
			return Sandbox{}, err
		}
	}
	if lower := want.limitsBelow(have); lower != (Limits{}) {
		if _, err := m.UpdateResources(ctx, id, lower); err != nil {
			return Sandbox{}, err
		}
	}
	_, unlock, err := m.lock(e, id)
	if err != nil { // deleted meanwhile: for the claimer, a member that changed
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "warm pool member %s changed while being claimed", id)
	}
	defer unlock()
	m.mu.Lock()
	if e.sb.State != StateRunning || e.sb.Pool == "" {
		m.mu.Unlock()
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "warm pool member %s changed while being claimed", id)
	}
	e.sb.Pool, e.sb.Owner = "", want.Owner
	e.sb.Env, e.sb.Metadata = cloneMap(want.Env), cloneMap(want.Metadata)
	e.sb.CreatedAt, e.sb.Deadline = want.CreatedAt, want.Deadline
	e.sb.IdleTimeout, e.sb.OnDeadline, e.sb.OnIdle = want.IdleTimeout, want.OnDeadline, want.OnIdle
	sb := e.sb.clone()
	m.mu.Unlock()
	e.act.touch(m.cfg.Now())
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording claim of sandbox %s: %w", id, err)
	}
	return sb, nil
}

// limitsBelow returns the CPU, memory and pids limits of sb that are lower
// than those of have (zero fields: no change).
func (sb Sandbox) limitsBelow(have Sandbox) Limits {
	var l Limits
	if sb.MilliCPUs != have.MilliCPUs {
		l.MilliCPUs = sb.MilliCPUs
	}
	if sb.MemoryBytes != have.MemoryBytes {
		l.MemoryBytes = sb.MemoryBytes
	}
	if sb.Pids != have.Pids {
		l.Pids = sb.Pids
	}
	return l
}
