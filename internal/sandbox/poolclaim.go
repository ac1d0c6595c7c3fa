package sandbox

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
)

// claim hands out a warm sandbox for spec when a pool fits it (see
// pool.go). It returns claimed false, and spec
// completed from the pool named in spec.Pool, when Create must make the
// sandbox cold. Errors are those of the spec.
func (m *Manager) claim(ctx context.Context, spec Spec) (Spec, Sandbox, bool, error) {
	m.pools.mu.Lock()
	none := len(m.pools.m) == 0
	m.pools.mu.Unlock()
	if spec.Pool == "" && none {
		return spec, Sandbox{}, false, nil
	}
	named, ok := m.poolDef(spec.Pool)
	if spec.Pool != "" {
		if !ok {
			return spec, Sandbox{}, false, errdefs.Errorf(errdefs.ErrNotFound, "pool %q not found", spec.Pool)
		}
		var err error
		if spec, err = fitPool(spec, named); err != nil {
			return spec, Sandbox{}, false, err
		}
	}
	want, _, err := m.admit(ctx, spec)
	if err != nil {
		return spec, Sandbox{}, false, err
	}
	if spec.Pool != "" && (want.Network.Mode == egress.ModeNone) != (named.Network == egress.ModeNone) {
		return spec, Sandbox{}, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "pool %q has network mode %s and cannot serve mode %s", spec.Pool, named.Network, want.Network.Mode)
	}
	// The caller's own limit applies to a claim as to a cold create.
	want.Owner = admission.Principal(ctx)
	start := time.Now()
	for {
		if err := m.adm.ReserveKey(want.Owner); err != nil {
			m.logFailedCreate(ctx, Sandbox{Runtime: want.Runtime, Template: want.Template}, time.Since(start), err)
			return spec, Sandbox{}, false, err
		}
		id, pool := m.takeMember(want, spec.Pool)
		if id == "" {
			m.adm.UnreserveKey(want.Owner)
			m.met.PoolMisses.Inc()
			return spec, Sandbox{}, false, nil
		}
		m.adm.Assign(id, want.Owner)
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

// poolDef returns the definition of pool name, if there is one.
func (m *Manager) poolDef(name string) (Pool, bool) {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	if p := m.pools.m[name]; p != nil {
		return p.def, true
	}
	return Pool{}, false
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
			// The replacement's create would take the CPUs the
			// claimer's first requests need (Config.PoolRefillDelay).
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
	// The member is the operator's until it is claimed: look it up and
	// shape it as the daemon, and give it to the caller's tenant.
	claimer, _ := tenancy.From(ctx)
	ctx = tenancy.AsDaemon(ctx)
	if err := m.ping(ctx, id, 2*time.Second); err != nil {
		return Sandbox{}, err
	}
	e, err := m.entry(ctx, id)
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
	e.sb.Pool, e.sb.Owner, e.sb.Tenant, e.sb.Key = "", want.Owner, claimer.Tenant, claimer.Key
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
