package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
)

// quotas holds what tenants' creates in flight take until their sandboxes
// are recorded, and the times of their recent creates, so that a
// tenant's quota (tenancy.Quota, from its key) holds under concurrent
// creates.
type quotas struct {
	mu      sync.Mutex
	pending map[string]usage       // tenant -> creates in flight
	recent  map[string][]time.Time // tenant -> creates in the last minute
}

// usage is what a tenant's sandboxes take of its quota.
type usage struct {
	sandboxes               int
	memory, milliCPUs, disk int64
}

func (u *usage) add(v usage, sign int) {
	u.sandboxes += sign * v.sandboxes
	u.memory += int64(sign) * v.memory
	u.milliCPUs += int64(sign) * v.milliCPUs
	u.disk += int64(sign) * v.disk
}

// reserveQuota checks that n more sandboxes with limits lim keep the
// caller's tenant within its quota, and holds them as in flight until
// release. A refusal is errdefs.ErrResourceExhausted naming the quota,
// with a retry hint where waiting helps (the create rate). The host's
// admission limits are checked apart, later.
func (m *Manager) reserveQuota(ctx context.Context, lim Limits, n int) (release func(), err error) {
	p, ok := tenancy.From(ctx)
	q := p.Quota
	if !ok || q == (tenancy.Quota{}) {
		return func() {}, nil
	}
	lim, err = m.bound(lim)
	if err != nil {
		return nil, err
	}
	add := usage{sandboxes: n, memory: int64(n) * lim.MemoryBytes, milliCPUs: int64(n) * lim.MilliCPUs, disk: int64(n) * lim.DiskBytes}
	return m.reserve(p, add, n)
}

// reserveMore checks that a sandbox the caller's tenant already has may
// take add more, and holds it as in flight until release: the memory and
// CPU of a stopped sandbox that starts again (it counts for sandboxes and
// disk already), or what a running one grows by. Nothing more is never
// refused.
func (m *Manager) reserveMore(ctx context.Context, add usage) (release func(), err error) {
	p, ok := tenancy.From(ctx)
	if !ok || p.Quota == (tenancy.Quota{}) || add == (usage{}) {
		return func() {}, nil
	}
	return m.reserve(p, add, 0)
}

// reserve holds add for p's tenant, counting n more creates against its
// rate, once the quota allows it.
func (m *Manager) reserve(p tenancy.Principal, add usage, n int) (release func(), err error) {
	q, now := p.Quota, m.cfg.Now()
	tenant := p.Tenant
	m.quota.mu.Lock()
	defer m.quota.mu.Unlock()
	if q.CreatesPerMinute > 0 && n > 0 {
		times := m.quota.recent[tenant]
		for len(times) > 0 && now.Sub(times[0]) >= time.Minute {
			times = times[1:]
		}
		if len(times)+n > q.CreatesPerMinute {
			m.quota.recent[tenant] = times
			wait := time.Minute - now.Sub(times[0])
			return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
				"tenant %s is at its quota of %d creates per minute", tenant, q.CreatesPerMinute), wait)
		}
	}
	use := m.tenantUsage(tenant)
	use.add(m.quota.pending[tenant], 1)
	use.add(add, 1)
	for _, c := range []struct {
		what      string
		have, max int64
		unit      string
		scale     float64
	}{
		{"sandboxes", int64(use.sandboxes), int64(q.Sandboxes), "", 1},
		{"memory", use.memory, q.MemoryBytes, " MiB", 1 << 20},
		{"CPU", use.milliCPUs, q.MilliCPUs, " CPUs", 1000},
		{"disk", use.disk, q.DiskBytes, " MiB", 1 << 20},
	} {
		if c.max > 0 && c.have > c.max {
			return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "tenant %s's %s quota is %s%s; this would take it to %s%s (delete sandboxes to make room)",
				tenant, c.what, num(float64(c.max)/c.scale), c.unit, num(float64(c.have)/c.scale), c.unit)
		}
	}
	if q.CreatesPerMinute > 0 {
		for range n {
			m.quota.recent[tenant] = append(m.quota.recent[tenant], now)
		}
	}
	p2 := m.quota.pending[tenant]
	p2.add(add, 1)
	m.quota.pending[tenant] = p2
	return sync.OnceFunc(func() {
		m.quota.mu.Lock()
		defer m.quota.mu.Unlock()
		u := m.quota.pending[tenant]
		u.add(add, -1)
		if u == (usage{}) {
			delete(m.quota.pending, tenant)
		} else {
			m.quota.pending[tenant] = u
		}
	}), nil
}

// tenantUsage adds up the recorded sandboxes of tenant: every sandbox
// counts and holds its disk; a stopped one holds no memory or CPU.
func (m *Manager) tenantUsage(tenant string) usage {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var u usage
	for _, e := range m.sandboxes {
		sb := e.sb
		if sb.Tenant != tenant || sb.Pool != "" {
			continue
		}
		u.sandboxes++
		u.disk += sb.DiskBytes
		if sb.State != StateStopped {
			u.memory += sb.MemoryBytes
			u.milliCPUs += sb.MilliCPUs
		}
	}
	return u
}

func num(v float64) string { return fmt.Sprintf("%g", v) }
