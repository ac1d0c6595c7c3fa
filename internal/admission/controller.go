package admission

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Claim is what one sandbox holds of the budget: its principal's share
// and its memory and CPU limits (zero: no limit, counted as nothing).
type Claim struct {
	Principal   string
	MemoryBytes int64
	MilliCPUs   int64
}

// waiter is a create in the admission queue: it waits for its claim of
// host capacity, then for a starting slot.
type waiter struct {
	id      string
	c       Claim
	claimed chan struct{} // closed when it holds its claim
	ready   chan struct{} // closed when admitted: it holds a slot too
	// Under Controller.mu.
	hasClaim, admitted bool
}

// pool reports whether w makes a warm pool member, which yields its
// place in the queue for a slot to every other create.
func (w *waiter) pool() bool { return w.c.Principal == PoolPrincipal }

// Controller keeps the admission budget: one claim per sandbox that
// exists or is being created, the starting slots, and the FIFO queue of
// creates waiting for either. Methods are safe for concurrent use.
type Controller struct {
	cfg            Config
	memCap, cpuCap int64 // 0: no bound
	onRefuse       func(reason string)
	onQueue        func(n int)

	mu       sync.Mutex
	held     map[string]Claim
	count    int
	mem, cpu int64
	perKey   map[string]int // claims and waiters per principal
	starting int            // slots taken
	queue    []*waiter
}

// Reserve takes claim c for sandbox id and a starting slot, or refuses
// them; it may wait for either (see Config). On success the caller owns
// the claim, which it gives back with Release, and the slot, which it
// gives back by calling started once the create is done.
func (a *Controller) Reserve(ctx context.Context, id string, c Claim) (started func(), err error) {
	a.mu.Lock()
	if a.memCap > 0 && c.MemoryBytes > a.memCap {
		a.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "memory %d bytes exceeds the host's capacity for sandboxes (%d bytes)", c.MemoryBytes, a.memCap)
	}
	if a.cpuCap > 0 && c.MilliCPUs > a.cpuCap {
		a.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cpus %d millicpus exceed the host's capacity for sandboxes (%d millicpus)", c.MilliCPUs, a.cpuCap)
	}
	if n := a.cfg.MaxPerPrincipal; n > 0 && c.Principal != PoolPrincipal && a.perKey[c.Principal] >= n {
		a.mu.Unlock()
		return nil, a.overPrincipal(n)
	}
	a.perKey[c.Principal]++
	w := &waiter{id: id, c: c, claimed: make(chan struct{}), ready: make(chan struct{})}
	// Strict FIFO: a create takes capacity only when no one waits for it,
	// and a slot only when dispatch left one free (no one waits for one).
	capWaiters, slotWaiters := a.waiting()
	reason := a.refusal(c)
	if capWaiters == 0 && reason == "" {
		a.take(id, c)
		w.hasClaim = true
		close(w.claimed)
		if a.slotFree() {
			a.starting++
			a.mu.Unlock()
			return a.started, nil
		}
	}
	// New checked that each queue has a wait.
	switch {
	case !w.hasClaim && (a.cfg.QueueLength == 0 || capWaiters >= a.cfg.QueueLength):
		if a.cfg.QueueLength > 0 {
			reason = RefusedQueueFull
		}
		a.dropKey(c.Principal)
		a.mu.Unlock()
		return nil, a.busy(reason)
	case w.hasClaim && (a.cfg.StartQueueLength == 0 || !w.pool() && slotWaiters >= a.cfg.StartQueueLength):
		reason = RefusedStarting
		if a.cfg.StartQueueLength > 0 {
			reason = RefusedStartQueueFull
		}
		a.releaseLocked(id)
		a.mu.Unlock()
		return nil, a.busy(reason)
	}
	a.queue = append(a.queue, w)
	a.onQueue(len(a.queue))
	a.mu.Unlock()
	return a.wait(ctx, w)
}

// wait waits for queued w to be admitted: up to MaxWait for its claim,
// then up to StartWait for a slot. A create that gives up leaves the
// queue and gives back what it holds.
func (a *Controller) wait(ctx context.Context, w *waiter) (func(), error) {
	claimed, d := w.claimed, a.cfg.MaxWait
	if a.holdsClaim(w) {
		claimed, d = nil, a.cfg.StartWait
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var reason string // of a refusal, or "" when ctx ended the wait
	for waiting := true; waiting; {
		select {
		case <-w.ready:
			return a.started, nil
		case <-claimed:
			claimed = nil
			t.Reset(a.cfg.StartWait)
		case <-t.C:
			switch {
			case claimed == nil && a.cfg.StartQueueLength == 0:
				// Waited for capacity, and may not wait for a slot.
				reason, waiting = RefusedStarting, false
			case claimed == nil:
				reason, waiting = RefusedStartWait, false
			case a.holdsClaim(w): // the claim came as the wait for it ended
				claimed = nil
				t.Reset(a.cfg.StartWait)
			default:
				reason, waiting = RefusedWait, false
			}
		case <-ctx.Done():
			waiting = false
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.admitted { // admitted just as the wait ended: the caller owns it
		return a.started, nil
	}
	a.queue = slices.DeleteFunc(a.queue, func(q *waiter) bool { return q == w })
	if w.hasClaim {
		a.releaseLocked(w.id) // and dispatch
	} else {
		a.dropKey(w.c.Principal)
		a.dispatch() // w may have been the one blocking the others
	}
	a.onQueue(len(a.queue))
	if reason == "" {
		return nil, fmt.Errorf("waiting for capacity: %w", ctx.Err())
	}
	return nil, a.busy(reason)
}

func (a *Controller) holdsClaim(w *waiter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return w.hasClaim
}

// started gives back a starting slot and admits the next waiter.
func (a *Controller) started() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.starting--
	a.dispatch()
}

func (a *Controller) slotFree() bool {
	return a.cfg.MaxStarting == 0 || a.starting < a.cfg.MaxStarting
}

// waiting counts the waiters without a claim, and those of creates other
// than pool members that hold one and wait for a slot.
func (a *Controller) waiting() (capacity, slot int) {
	for _, w := range a.queue {
		switch {
		case !w.hasClaim:
			capacity++
		case !w.pool():
			slot++
		}
	}
	return capacity, slot
}

// ReserveKey counts one more sandbox for principal p, a claim from a warm
// pool about to be handed out, or refuses it over the per-caller limit.
// The caller then calls Assign, or UnreserveKey when no member was taken.
func (a *Controller) ReserveKey(p string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.cfg.MaxPerPrincipal; n > 0 && a.perKey[p] >= n {
		return a.overPrincipal(n)
	}
	a.perKey[p]++
	return nil
}

// UnreserveKey gives back what ReserveKey took.
func (a *Controller) UnreserveKey(p string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropKey(p)
}

// Assign moves pool member id's claim to principal p, for whom
// ReserveKey counted it already.
func (a *Controller) Assign(id, p string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.held[id]
	if !ok { // gone meanwhile: nothing holds what ReserveKey counted
		a.dropKey(p)
		return
	}
	a.dropKey(c.Principal)
	c.Principal = p
	a.held[id] = c
}

// overPrincipal returns the refusal of a caller at its limit of n.
func (a *Controller) overPrincipal(n int) error {
	a.onRefuse(RefusedPrincipal)
	return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
		"too many sandboxes for this caller (API key, or the unix socket): at most %d may exist or be in creation at once", n), a.cfg.RetryAfter)
}

// busy returns the refusal of host capacity for reason.
func (a *Controller) busy(reason string) error {
	a.onRefuse(reason)
	msg := map[string]string{
		RefusedSandboxes: fmt.Sprintf("the server is at its limit of %d sandboxes", a.cfg.MaxSandboxes),
		RefusedMemory:    "the host's memory for sandboxes is fully committed",
		RefusedCPU:       "the host's CPUs for sandboxes are fully committed",
		RefusedQueueFull: "the server is at capacity and its admission queue is full",
		RefusedWait:      fmt.Sprintf("the server stayed at capacity for %s", a.cfg.MaxWait),
		RefusedStarting:  fmt.Sprintf("the server is starting as many sandboxes as it may at once (%d)", a.cfg.MaxStarting),
		RefusedStartQueueFull: fmt.Sprintf("the server is starting as many sandboxes as it may at once (%d) and %d more wait to start",
			a.cfg.MaxStarting, a.cfg.StartQueueLength),
		RefusedStartWait: fmt.Sprintf("no starting slot came free within %s", a.cfg.StartWait),
	}[reason]
	return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrBusy, "%s; retry later", msg), a.cfg.RetryAfter)
}

// refusal returns why c does not fit now, or "".
func (a *Controller) refusal(c Claim) string {
	switch {
	case a.cfg.MaxSandboxes > 0 && a.count >= a.cfg.MaxSandboxes:
		return RefusedSandboxes
	case a.memCap > 0 && a.mem+c.MemoryBytes > a.memCap:
		return RefusedMemory
	case a.cpuCap > 0 && a.cpu+c.MilliCPUs > a.cpuCap:
		return RefusedCPU
	}
	return ""
}

func (a *Controller) take(id string, c Claim) {
	a.held[id] = c
	a.count++
	a.mem += c.MemoryBytes
	a.cpu += c.MilliCPUs
}

func (a *Controller) dropKey(p string) {
	if a.perKey[p]--; a.perKey[p] <= 0 {
		delete(a.perKey, p)
	}
}

// Hold records claim c of sandbox id, which exists already (found at
// start), without checking it: a sandbox that runs counts whatever the
// limits say now.
func (a *Controller) Hold(id string, c Claim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[id]; !ok {
		a.take(id, c)
		a.perKey[c.Principal]++
	}
}

// Resize changes sandbox id's claim to mem bytes and cpu millicpus (a
// live limit change), refusing growth beyond host capacity with
// errdefs.ErrBusy. undo restores the old claim, for when the change then
// fails.
func (a *Controller) Resize(id string, mem, cpu int64) (undo func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, ok := a.held[id]
	if !ok {
		return func() {}, nil
	}
	switch {
	case a.memCap > 0 && mem > old.MemoryBytes && a.mem-old.MemoryBytes+mem > a.memCap:
		return nil, a.busy(RefusedMemory)
	case a.cpuCap > 0 && cpu > old.MilliCPUs && a.cpu-old.MilliCPUs+cpu > a.cpuCap:
		return nil, a.busy(RefusedCPU)
	}
	set := func(c Claim) {
		cur := a.held[id]
		a.mem += c.MemoryBytes - cur.MemoryBytes
		a.cpu += c.MilliCPUs - cur.MilliCPUs
		a.held[id] = c
		a.dispatch() // a shrink may let waiters in
	}
	set(Claim{old.Principal, mem, cpu})
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if _, ok := a.held[id]; ok {
			set(old)
		}
	}, nil
}

// Release gives back sandbox id's claim, if it holds one, and admits
// waiters that now fit.
func (a *Controller) Release(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(id)
}

func (a *Controller) releaseLocked(id string) {
	c, ok := a.held[id]
	if !ok {
		return
	}
	delete(a.held, id)
	a.count--
	a.mem -= c.MemoryBytes
	a.cpu -= c.MilliCPUs
	a.dropKey(c.Principal)
	a.dispatch()
}

// dispatch hands out what is free: claims to the waiters without one, in
// order, while host capacity allows; then slots to the waiters that hold
// a claim, in order, every other create before pool members.
func (a *Controller) dispatch() {
	for _, w := range a.queue {
		if w.hasClaim {
			continue
		}
		if a.refusal(w.c) != "" {
			break
		}
		a.take(w.id, w.c)
		w.hasClaim = true
		close(w.claimed)
	}
	n := len(a.queue)
	for a.slotFree() {
		i := slices.IndexFunc(a.queue, func(w *waiter) bool { return w.hasClaim && !w.pool() })
		if i < 0 {
			i = slices.IndexFunc(a.queue, func(w *waiter) bool { return w.hasClaim })
		}
		if i < 0 {
			break
		}
		w := a.queue[i]
		a.queue = slices.Delete(a.queue, i, i+1)
		a.starting++
		w.admitted = true
		close(w.ready)
	}
	if len(a.queue) != n {
		a.onQueue(len(a.queue))
	}
}

// Starting reports the slots taken, for tests and metrics.
func (a *Controller) Starting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.starting
}

// Usage reports the budget in use: claims, their memory and CPU, and
// the creates waiting, for tests and metrics.
func (a *Controller) Usage() (count int, mem, cpu int64, queued int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count, a.mem, a.cpu, len(a.queue)
}
