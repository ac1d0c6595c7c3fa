package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
)

// Metrics are the instruments the Manager and its helpers feed. The pool
// fields are registered (and read 0) whether or not pools exist; a claim
// (poolclaim.go) counts a hit and observes ClaimSeconds, or counts a miss. The
// pool sizes are read at each scrape (corral_pool_size).
type Metrics struct {
	// CreateSeconds: cold creates that succeeded, by runtime.
	CreateSeconds *metrics.Histogram
	// ExecStartSeconds: from an exec request to its process running (the
	// agent's start event), by runtime.
	ExecStartSeconds *metrics.Histogram
	// ClaimSeconds: creates served from a warm pool, by runtime.
	ClaimSeconds *metrics.Histogram
	// PoolHits and PoolMisses: creates a pool could and could not serve.
	PoolHits, PoolMisses *metrics.Counter
	// AdmissionRefusals: creates refused by admission control, by reason
	// (admission.Refused*).
	AdmissionRefusals *metrics.Counter
	// AdmissionQueue: creates waiting for capacity or a starting slot.
	AdmissionQueue *metrics.Gauge
}

// Metrics returns the Manager's instruments.
func (m *Manager) Metrics() *Metrics { return m.met }

// TenantMetrics names the families a tenant's key may read at /metrics:
// those made of its own sandboxes. Their functions count, for a request
// of a tenant, that tenant's sandboxes only (tenancy.Sees); the others
// describe the whole host and are the admins'.
func TenantMetrics() []string {
	return []string{"corral_sandboxes", "corral_sandbox_memory_bytes", "corral_sandbox_cpu_seconds_total"}
}

// statsTTL is how long per-sandbox usage read for one scrape serves the
// next ones: a scraper every few seconds costs one cgroup read per
// sandbox, not one per scrape per family.
const statsTTL = 2 * time.Second

// registerMetrics registers the Manager's families on r and returns the
// instruments it updates itself.
func (m *Manager) registerMetrics(r *metrics.Registry) *Metrics {
	met := &Metrics{
		CreateSeconds:     r.Histogram("corral_create_seconds", "Time to create a sandbox from scratch, by runtime.", nil, "runtime"),
		ExecStartSeconds:  r.Histogram("corral_exec_start_seconds", "Time from an exec request to its process running, by runtime.", nil, "runtime"),
		ClaimSeconds:      r.Histogram("corral_pool_claim_seconds", "Time to serve a create from a warm pool, by runtime.", nil, "runtime"),
		PoolHits:          r.Counter("corral_pool_hits_total", "Creates served from a warm pool."),
		PoolMisses:        r.Counter("corral_pool_misses_total", "Creates a warm pool could not serve."),
		AdmissionRefusals: r.Counter("corral_admission_refusals_total", "Creates refused by admission control, by reason.", "reason"),
		AdmissionQueue:    r.Gauge("corral_admission_queue_length", "Creates waiting for capacity or a starting slot."),
	}
	r.GaugeFunc("corral_sandboxes", "Sandboxes by state and runtime.", []string{"state", "runtime"}, func(ctx context.Context, emit metrics.Emit) {
		type key struct{ state, runtime string }
		n := map[key]float64{}
		for _, name := range m.runtimeNames() {
			n[key{StateRunning.String(), name}] = 0 // a family that reads 0 rather than vanishes
		}
		m.mu.RLock()
		for _, e := range m.sandboxes {
			if tenancy.Sees(ctx, e.sb.Tenant) {
				n[key{e.sb.State.String(), e.sb.Runtime}]++
			}
		}
		m.mu.RUnlock()
		for k, v := range n {
			emit(v, k.state, k.runtime)
		}
	})
	r.GaugeFunc("corral_admission_committed", "Budget held by sandboxes that exist or are being created: sandboxes, memory_bytes, millicpus.", []string{"resource"}, func(_ context.Context, emit metrics.Emit) {
		count, mem, cpu, _ := m.adm.Usage()
		emit(float64(count), "sandboxes")
		emit(float64(mem), "memory_bytes")
		emit(float64(cpu), "millicpus")
	})
	r.GaugeFunc("corral_admission_starting", "Creates being started now, within the limit of starting slots.", nil, func(_ context.Context, emit metrics.Emit) {
		emit(float64(m.adm.Starting()))
	})
	r.GaugeFunc("corral_pool_size", "Warm sandboxes ready to be claimed, by pool.", []string{"pool"}, func(_ context.Context, emit metrics.Emit) {
		m.pools.mu.Lock()
		defer m.pools.mu.Unlock()
		for name, p := range m.pools.m {
			emit(float64(len(p.ready)), name)
		}
	})
	r.GaugeFunc("corral_event_subscribers", "Open lifecycle event streams.", nil, func(_ context.Context, emit metrics.Emit) {
		emit(float64(m.bus.Subscribers()))
	})
	// The tenant label is the sandbox's owner ("" for the operator's).
	perSandbox := []string{"sandbox_id", "runtime", "tenant"}
	r.GaugeFunc("corral_sandbox_memory_bytes", "Memory used by each running or paused sandbox.", perSandbox, func(ctx context.Context, emit metrics.Emit) {
		for _, u := range m.usage.read(ctx, m) {
			emit(float64(u.stats.MemoryBytes), u.id, u.runtime, u.tenant)
		}
	})
	r.CounterFunc("corral_sandbox_cpu_seconds_total", "CPU time used by each running or paused sandbox.", perSandbox, func(ctx context.Context, emit metrics.Emit) {
		for _, u := range m.usage.read(ctx, m) {
			emit(float64(u.stats.CPUUsageNanos)/1e9, u.id, u.runtime, u.tenant)
		}
	})
	if q, ok := m.cfg.Storage.(storage.QuotaReporter); ok {
		r.GaugeFunc("corral_disk_quota_consistent", "1 while disk quota accounting is consistent (or off), 0 while disk limits are not enforced.", nil, func(_ context.Context, emit metrics.Emit) {
			emit(boolValue(q.QuotaStatus().Consistent))
		})
		r.CounterFunc("corral_disk_quota_inconsistencies_total", "Times disk quota accounting was found inconsistent.", nil, func(_ context.Context, emit metrics.Emit) {
			emit(float64(q.QuotaStatus().Inconsistencies))
		})
	}
	return met
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// usageCache holds each sandbox's usage as last read, for statsTTL.
type usageCache struct {
	mu      sync.Mutex
	entries map[string]sandboxUsage
}

type sandboxUsage struct {
	id, runtime, tenant string
	stats               driver.Stats
	at                  time.Time
}

// read returns the usage of every running or paused sandbox the caller of
// ctx sees (tenancy.Sees), read again from
// its driver when the cached value is older than statsTTL. Drivers are
// asked a few at a time under ctx, which bounds the scrape; sandboxes
// whose stats are not read in time, or fail, are left out.
func (c *usageCache) read(ctx context.Context, m *Manager) []sandboxUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var fresh, todo []sandboxUsage
	live := map[string]bool{}
	m.mu.RLock()
	for _, e := range m.sandboxes {
		if e.sb.State != StateRunning && e.sb.State != StatePaused {
			continue
		}
		live[e.sb.ID] = true
		if !tenancy.Sees(ctx, e.sb.Tenant) {
			continue
		}
		// A pool member changes tenant when claimed: a cached value
		// keeps its usage, not its owner.
		if u, ok := c.entries[e.sb.ID]; ok && now.Sub(u.at) < statsTTL {
			u.tenant = e.sb.Tenant
			fresh = append(fresh, u)
		} else {
			todo = append(todo, sandboxUsage{id: e.sb.ID, runtime: e.sb.Runtime, tenant: e.sb.Tenant})
		}
	}
	m.mu.RUnlock()
	for id := range c.entries {
		if !live[id] {
			delete(c.entries, id)
		}
	}
	ok := make([]bool, len(todo))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range todo {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			st, err := m.drivers[todo[i].runtime].Stats(ctx, todo[i].id)
			if err == nil {
				todo[i].stats, todo[i].at, ok[i] = st, time.Now(), true
			}
		})
	}
	wg.Wait()
	if c.entries == nil {
		c.entries = map[string]sandboxUsage{}
	}
	for i, u := range todo {
		if ok[i] {
			c.entries[u.id] = u
			fresh = append(fresh, u)
		}
	}
	return fresh
}
