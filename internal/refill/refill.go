// Package refill runs the background rounds that keep a set of things made
// ahead (spare networks, spare user namespaces) full: a round starts a
// delay after someone takes one, so that making the replacement does not
// compete with the work that took it, and only one round runs at a time.
package refill

import (
	"sync"
	"time"
)

// Refiller schedules and runs rounds of Next. Create it with New; its
// methods are safe for concurrent use.
type Refiller struct {
	delay time.Duration
	next  func() (bool, error)

	mu        sync.Mutex
	done      *sync.Cond // signals the end of a round
	timer     *time.Timer
	scheduled bool // the timer is set to go off
	running   bool
	again     bool // Schedule was asked for while a round ran
	closed    bool
}

// New returns a Refiller whose rounds call next until it reports that it
// made nothing (the set is full) or fails; a failure ends the round, and
// the next Schedule starts another. next must not call the Refiller.
func New(delay time.Duration, next func() (made bool, err error)) *Refiller {
	r := &Refiller{delay: delay, next: next}
	r.done = sync.NewCond(&r.mu)
	return r
}

// Schedule starts a round after the delay, unless one is already
// scheduled: during a stream of takes rounds run every delay, not only
// once the stream pauses. A Schedule while a round runs gets a round
// after it, for what was taken after the running round last looked.
func (r *Refiller) Schedule() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.schedule()
}

func (r *Refiller) schedule() {
	if r.closed || r.scheduled {
		return
	}
	r.scheduled = true
	if r.timer == nil {
		r.timer = time.AfterFunc(r.delay, r.Run)
		return
	}
	r.timer.Reset(r.delay)
}

// Run runs a round now, unless one is running (which then runs another
// when it ends) or the Refiller is closed. It returns when the round ends.
func (r *Refiller) Run() {
	r.mu.Lock()
	r.scheduled = false
	if r.closed || r.running {
		r.again = r.again || r.running
		r.mu.Unlock()
		return
	}
	r.running = true
	r.mu.Unlock()
	failed := false
	for {
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			break
		}
		made, err := r.next()
		if err != nil {
			failed = true
			break
		}
		if !made {
			break
		}
	}
	r.mu.Lock()
	r.running = false
	if r.again && !failed {
		r.schedule()
	}
	r.again = false
	r.done.Broadcast()
	r.mu.Unlock()
}

// Stop cancels a scheduled round and waits for a running one to end;
// Schedule starts rounds again.
func (r *Refiller) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stop()
}

func (r *Refiller) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
	r.scheduled = false
	for r.running {
		r.done.Wait()
	}
}

// Close is Stop for good: no round runs after it returns.
func (r *Refiller) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.stop()
}
