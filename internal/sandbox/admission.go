package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Admission bounds what a Manager accepts, decided before a create
// acquires anything. Zero fields mean no bound.
//
// Host capacity (MaxSandboxes and the commit ratios) is the server's: a
// create over it fails with errdefs.ErrBusy (HTTP 503), or waits in a
// bounded FIFO queue when QueueLength and MaxWait allow. The per-principal
// limit is the caller's own: a create over it fails at once with
// errdefs.ErrResourceExhausted (HTTP 429). Both carry a retry hint
// (errdefs.RetryAfter).
//
// MaxStarting bounds the creates that run at once, from storage to the
// agent's ready answer: a create that fits host capacity takes its share
// of it, then waits in the same FIFO queue for a starting slot (up to
// StartQueueLength waiters, each for StartWait) or is refused with
// errdefs.ErrBusy. Creates of warm pool members take slots too, but only
// when no other create waits for one, and do not count against
// StartQueueLength (the pool's own concurrency bounds them).
type Admission struct {
	// MaxSandboxes bounds the sandboxes that exist or are being created.
	MaxSandboxes int
	// MemoryCommitRatio bounds the sum of sandboxes' memory limits to
	// HostMemoryBytes times the ratio; CPUCommitRatio bounds the sum of
	// their CPU limits to HostMilliCPUs times the ratio. Sandboxes without
	// a limit count as zero.
	MemoryCommitRatio float64
	CPUCommitRatio    float64
	// HostMemoryBytes and HostMilliCPUs are the host's size (default:
	// MemTotal of /proc/meminfo and the CPUs this process may use).
	HostMemoryBytes int64
	HostMilliCPUs   int64
	// MaxPerPrincipal bounds the sandboxes one principal (an API key, the
	// unix socket; see WithPrincipal) has or is creating at a time.
	MaxPerPrincipal int
	// QueueLength is how many creates may wait for host capacity at once
	// and MaxWait how long each may wait; without both a create over
	// capacity fails at once.
	QueueLength int
	MaxWait     time.Duration
	// MaxStarting bounds the creates being started at once: more would
	// share the host's CPUs so thinly that each runs past its runtime's
	// start timeout (see StartingPerCPU).
	MaxStarting int
	// StartQueueLength is how many creates may wait for a starting slot
	// at once and StartWait how long each may wait (required with a
	// queue); without a queue a create that finds every slot taken fails
	// at once.
	StartQueueLength int
	StartWait        time.Duration
	// RetryAfter is the hint sent with refusals (default 1s).
	RetryAfter time.Duration
}

// The starting limits of a daemon that names none: per CPU this process
// may use, the creates started at once and those that may wait for a
// slot, and how long each may wait. Chosen so that every start stays far
// inside the runtimes' start timeout, gVisor's starts being the slowest,
// and a full queue drains within StartWait (docs/BENCHMARKS.md has the
// measured rates).
const (
	StartingPerCPU   = 2
	StartQueuePerCPU = 32
	DefaultStartWait = 10 * time.Second
)

// The reasons of admission refusals, as counted in metrics.
const (
	RefusedSandboxes = "max_sandboxes"
	RefusedMemory    = "memory"
	RefusedCPU       = "cpu"
	RefusedPrincipal = "per_principal"
	RefusedQueueFull = "queue_full"
	RefusedWait      = "wait_timeout"
	// Refusals for want of a starting slot: every slot taken and no start
	// queue, the start queue full, the wait for a slot too long.
	RefusedStarting       = "starting"
	RefusedStartQueueFull = "start_queue_full"
	RefusedStartWait      = "start_wait_timeout"
)

type principalKey struct{}

// WithPrincipal returns ctx naming the principal a create is made for,
// for per-principal limits. The server sets it per listener and key;
// creates without one share the principal "".
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// APIKeyPrincipal names the principal of an API key without holding the
// key itself: a short digest, safe to log.
func APIKeyPrincipal(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:6])
}

func principalOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}

// claim is what one sandbox holds of the admission budget.
type claim struct {
	principal string
	mem, cpu  int64
}

// waiter is a create in the admission queue: it waits for its claim of
// host capacity, then for a starting slot.
type waiter struct {
	id      string
	c       claim
	claimed chan struct{} // closed when it holds its claim
	ready   chan struct{} // closed when admitted: it holds a slot too
	// Under admitter.mu.
	hasClaim, admitted bool
}

// pool reports whether w makes a warm pool member, which yields its
// place in the queue for a slot to every other create.
func (w *waiter) pool() bool { return w.c.principal == poolPrincipal }

// admitter keeps the admission budget: one claim per sandbox that exists
// or is being created, the starting slots, and the FIFO queue of creates
// waiting for either. Methods are safe for concurrent use.
type admitter struct {
	cfg            Admission
	memCap, cpuCap int64 // 0: no bound
	onRefuse       func(reason string)
	onQueue        func(n int)

	mu       sync.Mutex
	held     map[string]claim
	count    int
	mem, cpu int64
	perKey   map[string]int // claims and waiters per principal
	starting int            // slots taken
	queue    []*waiter
}

func newAdmitter(cfg Admission) (*admitter, error) {
	if cfg.MaxSandboxes < 0 || cfg.MaxPerPrincipal < 0 || cfg.QueueLength < 0 || cfg.MaxWait < 0 ||
		cfg.MemoryCommitRatio < 0 || cfg.CPUCommitRatio < 0 ||
		cfg.MaxStarting < 0 || cfg.StartQueueLength < 0 || cfg.StartWait < 0 {
		return nil, errors.New("admission limits must not be negative")
	}
	if (cfg.QueueLength > 0) != (cfg.MaxWait > 0) {
		return nil, errors.New("an admission queue needs both a length and a maximum wait")
	}
	if cfg.StartQueueLength > 0 && cfg.StartWait == 0 {
		return nil, errors.New("a start queue needs a maximum wait")
	}
	if cfg.StartQueueLength == 0 {
		cfg.StartWait = 0
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	a := &admitter{cfg: cfg, held: map[string]claim{}, perKey: map[string]int{}, onRefuse: func(string) {}, onQueue: func(int) {}}
	if cfg.MemoryCommitRatio > 0 {
		host := cfg.HostMemoryBytes
		if host == 0 {
			var err error
			if host, err = hostMemory(); err != nil {
				return nil, err
			}
		}
		a.memCap = int64(float64(host) * cfg.MemoryCommitRatio)
	}
	if cfg.CPUCommitRatio > 0 {
		host := cfg.HostMilliCPUs
		if host == 0 {
			host = int64(runtime.NumCPU()) * 1000
		}
		a.cpuCap = int64(float64(host) * cfg.CPUCommitRatio)
	}
	return a, nil
}

// hostMemory reads MemTotal from /proc/meminfo.
func hostMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("reading host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing MemTotal %q: %w", rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("reading host memory: no MemTotal in /proc/meminfo")
}

// reserve takes a claim for sandbox id, made for ctx's principal, and a
// starting slot, or refuses them. It may wait for either (see Admission).
// On success the caller owns the claim, which it must release, and the
// slot, which it gives back by calling started once the create is done.
func (a *admitter) reserve(ctx context.Context, id string, c claim) (started func(), err error) {
	a.mu.Lock()
	if a.memCap > 0 && c.mem > a.memCap {
		a.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "memory %d bytes exceeds the host's capacity for sandboxes (%d bytes)", c.mem, a.memCap)
	}
	if a.cpuCap > 0 && c.cpu > a.cpuCap {
		a.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cpus %d millicpus exceed the host's capacity for sandboxes (%d millicpus)", c.cpu, a.cpuCap)
	}
	if n := a.cfg.MaxPerPrincipal; n > 0 && c.principal != poolPrincipal && a.perKey[c.principal] >= n {
		a.mu.Unlock()
		a.onRefuse(RefusedPrincipal)
		return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
			"too many sandboxes for this caller (API key, or the unix socket): at most %d may exist or be in creation at once", n), a.cfg.RetryAfter)
	}
	a.perKey[c.principal]++
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
	// newAdmitter checked that each queue has a wait.
	switch {
	case !w.hasClaim && (a.cfg.QueueLength == 0 || capWaiters >= a.cfg.QueueLength):
		if a.cfg.QueueLength > 0 {
			reason = RefusedQueueFull
		}
		a.dropKey(c.principal)
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
func (a *admitter) wait(ctx context.Context, w *waiter) (func(), error) {
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
		a.dropKey(w.c.principal)
		a.dispatch() // w may have been the one blocking the others
	}
	a.onQueue(len(a.queue))
	if reason == "" {
		return nil, fmt.Errorf("waiting for capacity: %w", ctx.Err())
	}
	return nil, a.busy(reason)
}

func (a *admitter) holdsClaim(w *waiter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return w.hasClaim
}

// started gives back a starting slot and admits the next waiter.
func (a *admitter) started() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.starting--
	a.dispatch()
}

func (a *admitter) slotFree() bool {
	return a.cfg.MaxStarting == 0 || a.starting < a.cfg.MaxStarting
}

// waiting counts the waiters without a claim, and those of creates other
// than pool members that hold one and wait for a slot.
func (a *admitter) waiting() (capacity, slot int) {
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

// poolPrincipal holds the claims of unclaimed warm pool members: they
// count against host capacity, and against a caller's limit only once
// claimed (reserveKey, assign). No API key maps to it.
const poolPrincipal = "\x00pool"

// claimOf returns the claim sandbox sb holds.
func claimOf(sb Sandbox) claim {
	p := sb.Owner
	if sb.Pool != "" {
		p = poolPrincipal
	}
	return claim{p, sb.MemoryBytes, sb.MilliCPUs}
}

// reserveKey counts one more sandbox for principal p, a claim from a warm
// pool about to be handed out, or refuses it over the per-caller limit.
// The caller then calls assign, or unreserveKey when no member was taken.
func (a *admitter) reserveKey(p string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.cfg.MaxPerPrincipal; n > 0 && a.perKey[p] >= n {
		a.onRefuse(RefusedPrincipal)
		return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrResourceExhausted,
			"too many sandboxes for this caller (API key, or the unix socket): at most %d may exist or be in creation at once", n), a.cfg.RetryAfter)
	}
	a.perKey[p]++
	return nil
}

// unreserveKey gives back what reserveKey took.
func (a *admitter) unreserveKey(p string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropKey(p)
}

// assign moves pool member id's claim to principal p, for whom
// reserveKey counted it already.
func (a *admitter) assign(id, p string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.held[id]
	if !ok { // gone meanwhile: nothing holds what reserveKey counted
		a.dropKey(p)
		return
	}
	a.dropKey(c.principal)
	c.principal = p
	a.held[id] = c
}

// busy returns the refusal of host capacity for reason.
func (a *admitter) busy(reason string) error {
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
func (a *admitter) refusal(c claim) string {
	switch {
	case a.cfg.MaxSandboxes > 0 && a.count >= a.cfg.MaxSandboxes:
		return RefusedSandboxes
	case a.memCap > 0 && a.mem+c.mem > a.memCap:
		return RefusedMemory
	case a.cpuCap > 0 && a.cpu+c.cpu > a.cpuCap:
		return RefusedCPU
	}
	return ""
}

func (a *admitter) take(id string, c claim) {
	a.held[id] = c
	a.count++
	a.mem += c.mem
	a.cpu += c.cpu
}

func (a *admitter) dropKey(p string) {
	if a.perKey[p]--; a.perKey[p] <= 0 {
		delete(a.perKey, p)
	}
}

// hold records the claim of a sandbox that exists already (found at
// start) without checking it.
func (a *admitter) hold(id string, c claim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[id]; !ok {
		a.take(id, c)
		a.perKey[c.principal]++
	}
}

// resize changes sandbox id's claim to mem and cpu (a live limit change),
// refusing growth beyond host capacity with errdefs.ErrBusy. undo restores
// the old claim, for when the change then fails.
func (a *admitter) resize(id string, mem, cpu int64) (undo func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, ok := a.held[id]
	if !ok {
		return func() {}, nil
	}
	switch {
	case a.memCap > 0 && mem > old.mem && a.mem-old.mem+mem > a.memCap:
		return nil, a.busy(RefusedMemory)
	case a.cpuCap > 0 && cpu > old.cpu && a.cpu-old.cpu+cpu > a.cpuCap:
		return nil, a.busy(RefusedCPU)
	}
	set := func(c claim) {
		cur := a.held[id]
		a.mem += c.mem - cur.mem
		a.cpu += c.cpu - cur.cpu
		a.held[id] = c
		a.dispatch() // a shrink may let waiters in
	}
	set(claim{old.principal, mem, cpu})
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if _, ok := a.held[id]; ok {
			set(old)
		}
	}, nil
}

// release gives back sandbox id's claim, if it holds one, and admits
// waiters that now fit.
func (a *admitter) release(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(id)
}

func (a *admitter) releaseLocked(id string) {
	c, ok := a.held[id]
	if !ok {
		return
	}
	delete(a.held, id)
	a.count--
	a.mem -= c.mem
	a.cpu -= c.cpu
	a.dropKey(c.principal)
	a.dispatch()
}

// dispatch hands out what is free: claims to the waiters without one, in
// order, while host capacity allows; then slots to the waiters that hold
// a claim, in order, every other create before pool members.
func (a *admitter) dispatch() {
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

// startingNow reports the slots taken, for tests and metrics.
func (a *admitter) startingNow() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.starting
}

// usage reports the budget in use, for tests and metrics.
func (a *admitter) usage() (count int, mem, cpu int64, queued int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count, a.mem, a.cpu, len(a.queue)
}
