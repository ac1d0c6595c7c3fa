package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
)

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
// a refill must not starve the cold creates of a host with few CPUs.
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
	sb, drv, err := m.admit(ctx, Spec{Template: def.Template, Runtime: def.Runtime, MilliCPUs: def.MilliCPUs,
		MemoryBytes: def.MemoryBytes, Pids: def.Pids, DiskBytes: def.DiskBytes, Network: egress.Policy{Mode: def.Network}})
	if err != nil {
		m.log.Warn("refilling warm pool", "pool", def.Name, "err", err)
		return "", err
	}
	sb.Pool, sb.Deadline = def.Name, time.Time{}
	sb, err = m.createFresh(ctx, sb, drv, nil)
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
