package network

import (
	"time"
)

// Teardown of a sandbox with a veth does the part that is quick and ends
// the sandbox's network at once (egress detached, namespace unmounted) and
// queues the rest here: its nftables chains and map entries, and the check
// that its veth is gone, are removed for every queued sandbox in one batch,
// off the caller's path. The kernel waits an RCU grace period for each
// nftables commit that deletes something and in rcu_barrier for each veth
// it unregisters; batching pays those once per batch instead of once per
// sandbox, and unmounting the namespace lets the kernel delete both veth
// ends in its own batched namespace cleanup.
//
// Until its batch is done a sandbox's address slot stays reserved, so its
// interface name is never reused early, and its id waits in Setup. Close
// and Reconcile wait for the queue to drain. The goroutine that drains it
// exists only while the queue is not empty.

// linkGoneTimeout bounds the wait for the kernel to delete a veth whose
// namespace was unmounted; after it the veth is deleted explicitly (some
// process or socket still held the namespace).
const linkGoneTimeout = 2 * time.Second

// reapItem is the rest of one sandbox's teardown.
type reapItem struct {
	id, iface string
	slot      int
}

// queueReap queues it and starts the reaper if it is not running. The
// caller holds m.mu.
func (m *Manager) queueReap(it reapItem) {
	m.reapQ = append(m.reapQ, it)
	m.reaping[it.id] = true
	if !m.reaperRunning {
		m.reaperRunning = true
		go m.reapLoop()
	}
}

// reapLoop removes queued leftovers in batches until the queue is empty.
func (m *Manager) reapLoop() {
	for {
		m.mu.Lock()
		batch := m.reapQ
		m.reapQ = nil
		if len(batch) == 0 {
			m.reaperRunning = false
			m.reapCond.Broadcast()
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		m.reap(batch)
		m.mu.Lock()
		for _, it := range batch {
			if m.used[it.slot] == it.id {
				delete(m.used, it.slot)
			}
			delete(m.reaping, it.id)
		}
		m.reapCond.Broadcast()
		m.mu.Unlock()
	}
}

// reap removes the chains, map entries and veths of batch. Failures are
// logged: what is left carries the sandbox's id and is removed by the next
// Reconcile.
func (m *Manager) reap(batch []reapItem) {
	start := time.Now()
	if err := m.nft.removeSandboxes(batch); err != nil {
		m.log.Warn("removing nftables chains of torn-down sandboxes", "sandboxes", len(batch), "error", err)
	}
	deadline := start.Add(linkGoneTimeout)
	for _, it := range batch {
		for time.Now().Before(deadline) {
			if _, err := m.nl.LinkByName(it.iface); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := m.deleteLink(it.iface); err != nil {
			m.log.Warn("deleting veth of torn-down sandbox", "sandbox_id", it.id, "iface", it.iface, "error", err)
		}
	}
	m.log.Debug("network teardowns finished", "sandboxes", len(batch), "duration_ms", float64(time.Since(start).Microseconds())/1000)
}

// waitReaped waits until no teardown is queued or running.
func (m *Manager) waitReaped() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.reaperRunning {
		m.reapCond.Wait()
	}
}

// waitReapedID waits until id's teardown, if one is queued, is done. The
// caller holds m.mu.
func (m *Manager) waitReapedID(id string) {
	for m.reaping[id] {
		m.reapCond.Wait()
	}
}
