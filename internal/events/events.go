// Package events is the publish/subscribe bus of sandbox lifecycle events:
// the Manager publishes one Event per state change and any number of
// subscribers (the /v1/events stream) read them.
//
// Publishing never blocks and never fails: each subscriber has a bounded
// buffer, and a subscriber whose buffer is full is dropped, receiving a
// final error event instead of the one that did not fit. The bus does not
// persist or replay events; a subscriber sees what happens after it
// subscribed.
package events

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// The lifecycle event types.
const (
	Created = "created" // recorded as creating; its resources may still be being made
	Running = "running" // created and started, or back from an error-free restart
	Paused  = "paused"  // frozen
	Resumed = "resumed" // thawed; the sandbox is running again
	Deleted = "deleted" // released and forgotten (also after a failed create)
	Error   = "error"   // with a sandbox ID: the sandbox entered the error state; without one: the stream ends
	Timeout = "timeout" // the deadline passed; a deleted event follows
	Stopped = "stopped" // every process ended; the files stay for a start
	Started = "started" // a stopped sandbox booted again; it is running
	// OOMKilled: the kernel killed a process of the sandbox, or the whole
	// sandbox, for going past its memory limit; one event per kill the
	// Manager learns of (an exec's process dying of it, or the instance).
	OOMKilled = "oom_killed"
)

// OverflowCode is the error code of the event that ends a dropped
// subscriber's stream (errdefs.CodeResourceExhausted).
const OverflowCode = "resource_exhausted"

// Types lists the event types a filter may name.
var Types = []string{Created, Running, Paused, Resumed, Stopped, Started, Deleted, Error, Timeout, OOMKilled}

// Event is one lifecycle change, as streamed by /v1/events.
type Event struct {
	Type      string    `json:"type"`
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	// State is the sandbox's state after the change ("deleted" events
	// carry the last one).
	State    string `json:"state,omitempty"`
	Runtime  string `json:"runtime,omitempty"`
	Template string `json:"template,omitempty"`
	// Tenant owns the sandbox ("" is the operator); streams show a
	// tenant its own sandboxes' events only.
	Tenant string       `json:"tenant,omitempty"`
	Error  *ErrorDetail `json:"error,omitempty"`
}

// ErrorDetail says why a sandbox failed or why a stream ended, with a
// machine-readable code as in API errors.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Filter selects events; zero fields match everything.
type Filter struct {
	SandboxID string
	Types     []string
}

func (f Filter) match(ev Event) bool {
	if ev.SandboxID == "" { // stream-level events reach everyone
		return true
	}
	if f.SandboxID != "" && ev.SandboxID != f.SandboxID {
		return false
	}
	return len(f.Types) == 0 || slices.Contains(f.Types, ev.Type)
}

// DefaultBuffer is how many events a subscriber may fall behind before it
// is dropped.
const DefaultBuffer = 256

// Bus fans events out to subscribers. It is safe for concurrent use; the
// zero value is not usable, call NewBus.
type Bus struct {
	buffer int
	now    func() time.Time

	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
}

// NewBus returns a bus whose subscribers may fall buffer events behind
// (DefaultBuffer when buffer <= 0).
func NewBus(buffer int) *Bus {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Bus{buffer: buffer, now: time.Now, subs: map[*Subscription]struct{}{}}
}

// Subscription receives the events matching its filter on C until Close,
// or until it falls behind: then its last event is an Error event without
// sandbox ID and C is closed.
type Subscription struct {
	ch     chan Event
	filter Filter
	bus    *Bus
}

// C returns the channel of events. It is closed when the subscription is
// closed or dropped.
func (s *Subscription) C() <-chan Event { return s.ch }

// Close ends the subscription and closes C. It is safe to call more than
// once and after a drop.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if _, ok := s.bus.subs[s]; ok {
		delete(s.bus.subs, s)
		close(s.ch)
	}
}

// Subscribe returns a subscription to the events matching f from now on.
// The caller must Close it.
func (b *Bus) Subscribe(f Filter) *Subscription {
	// One slot more than the buffer, kept for the final error event.
	s := &Subscription{ch: make(chan Event, b.buffer+1), filter: f, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(s.ch)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

// Close ends every subscription (their channels close without an error
// event) and makes later ones end at once, so that streams do not hold up
// a server's shutdown. Publishing after Close is allowed and reaches
// nobody.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		delete(b.subs, s)
		close(s.ch)
	}
}

// Subscribers returns how many subscriptions are open.
func (b *Bus) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Publish delivers ev to every matching subscriber without blocking; a
// zero Time is set to now. Sends happen under the bus lock, and only here,
// so checking a channel's length first makes the send non-blocking.
func (b *Bus) Publish(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = b.now().UTC()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if !s.filter.match(ev) {
			continue
		}
		if len(s.ch) < cap(s.ch)-1 {
			s.ch <- ev
			continue
		}
		s.ch <- Event{Type: Error, Time: ev.Time, Error: &ErrorDetail{
			Code:    OverflowCode,
			Message: fmt.Sprintf("event stream dropped: the subscriber fell %d events behind", b.buffer),
		}}
		delete(b.subs, s)
		close(s.ch)
	}
}
