package webhook

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/metrics"
)

// DefaultQueueSize is how many deliveries may wait for a slow or
// unreachable receiver before the oldest is dropped.
const DefaultQueueSize = 1024

// Payload is the JSON body of one request.
type Payload struct {
	// ID is the delivery's unique ID, the same in every attempt.
	ID    string    `json:"id"`
	Event string    `json:"event"`
	Time  time.Time `json:"time"`
	// SandboxID, State (after the change; a deleted sandbox's last one),
	// Runtime and Template are the bus event's.
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state,omitempty"`
	Runtime   string `json:"runtime,omitempty"`
	Template  string `json:"template,omitempty"`
	// Tenant owns the sandbox; absent for the operator's.
	Tenant string              `json:"tenant,omitempty"`
	Error  *events.ErrorDetail `json:"error,omitempty"`
}

// names maps the bus's event types to the events webhooks send.
var names = map[string]string{
	events.Created: "created",
	events.Running: "running",
	events.Paused:  "paused",
	events.Resumed: "resumed",
	events.Stopped: "stopped",
	events.Started: "started",
	events.Deleted: "deleted",
	events.Timeout: "expired",
	events.Error:   "failed",

	events.OOMKilled: "oom_killed",
}

// Options configure a Sender.
type Options struct {
	// URL receives the events; it must pass CheckURL.
	URL string
	// Secret, when set, signs every request (X-Corral-Signature).
	Secret string
	// Version goes into the User-Agent header, corral/<Version>.
	Version string
	// QueueSize bounds the deliveries waiting (DefaultQueueSize when <= 0).
	QueueSize int
	// Deliveries, when set, counts deliveries by their one label, the
	// result: "ok", "failed" (refused, or out of attempts) or "dropped"
	// (pushed out of a full queue, or still queued at Close).
	Deliveries *metrics.Counter
	Logger     *slog.Logger

	// The retry policy, shortened by tests; zero values take the
	// documented defaults.
	minBackoff, maxBackoff, timeout time.Duration
	attempts                        int
}

// CheckURL says whether raw can be a webhook URL: absolute, http or
// https, with a host.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("webhook URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("webhook URL %q: want an http or https URL", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("webhook URL %q: no host", raw)
	}
	return nil
}

// Sender delivers the sandbox events of one bus to one URL. Its two
// goroutines, one reading the bus into the queue and one delivering from
// it, run until Close.
type Sender struct {
	opts      Options
	target    string // the URL without user info, query or fragment, for logs and errors
	userAgent string
	client    *http.Client
	log       *slog.Logger

	mu      sync.Mutex
	queue   []delivery
	dropped int  // drops not yet logged
	closing bool // Close has been called: deliver what is queued, then end
	wake    chan struct{}

	stop       chan struct{} // closed by Close: stop reading the bus
	stopOnce   sync.Once
	readerDone chan struct{}
	workerDone chan struct{}
	cancel     context.CancelFunc // ends the worker's request or wait
}

// delivery is one event's request body and what logs say of it.
type delivery struct {
	id, event, sandboxID string
	body                 []byte
}

// New subscribes to bus and starts delivering its sandbox events to
// opts.URL. The caller must Close the Sender.
func New(bus *events.Bus, opts Options) (*Sender, error) {
	if err := CheckURL(opts.URL); err != nil {
		return nil, err
	}
	u, _ := url.Parse(opts.URL)
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.minBackoff <= 0 {
		opts.minBackoff = time.Second
	}
	if opts.maxBackoff <= 0 {
		opts.maxBackoff = time.Minute
	}
	if opts.timeout <= 0 {
		opts.timeout = 10 * time.Second
	}
	if opts.attempts <= 0 {
		opts.attempts = 8
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	target := u.Scheme + "://" + u.Host + u.EscapedPath()
	s := &Sender{
		opts:      opts,
		target:    target,
		userAgent: "corral/" + cmp.Or(opts.Version, "dev"),
		client: &http.Client{
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
			// A redirect would send the signed body where the operator
			// did not say; it fails the delivery instead.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		log:        opts.Logger.With("webhook", target),
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		readerDone: make(chan struct{}),
		workerDone: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.read(bus, bus.Subscribe(events.Filter{}))
	go s.work(ctx)
	return s, nil
}

// Close stops taking events, keeps delivering what is queued until the
// queue is empty or ctx ends, and returns once both goroutines have
// ended. Deliveries left are dropped, and the error says how many. Calls
// after the first return nil at once.
func (s *Sender) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.readerDone
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.signal()
	select {
	case <-s.workerDone:
	case <-ctx.Done():
		s.cancel()
		<-s.workerDone
	}
	s.cancel()
	s.client.CloseIdleConnections()
	s.mu.Lock()
	left := len(s.queue)
	s.queue = nil
	s.mu.Unlock()
	if left == 0 {
		return nil
	}
	s.count("dropped", left)
	return fmt.Errorf("webhook %s: %d deliveries left undelivered: %w", s.target, left, context.Cause(ctx))
}

// read moves the bus's sandbox events into the queue until Close or until
// the bus closes. A subscription the bus drops because this Sender fell
// behind is replaced at once; what was published in between is lost.
func (s *Sender) read(bus *events.Bus, sub *events.Subscription) {
	defer close(s.readerDone)
	for {
		select {
		case <-s.stop:
			// The events published before Close are still buffered in
			// the closed channel.
			sub.Close()
			for ev := range sub.C() {
				s.enqueue(ev)
			}
			return
		case ev, ok := <-sub.C():
			switch {
			case !ok: // the bus closed
				return
			case ev.SandboxID != "":
				s.enqueue(ev)
			case ev.Type == events.Error:
				// Without a sandbox ID, an error event ends the stream.
				reason := ""
				if ev.Error != nil {
					reason = ev.Error.Message
				}
				s.log.Warn("webhook events lost: the bus dropped the subscription; subscribing again", "reason", reason)
				sub.Close()
				sub = bus.Subscribe(events.Filter{})
			}
		}
	}
}

// enqueue turns a sandbox event into a delivery and queues it, dropping
// the oldest queued one when the queue is full.
func (s *Sender) enqueue(ev events.Event) {
	name, ok := names[ev.Type]
	if !ok || ev.SandboxID == "" {
		return
	}
	d := delivery{id: rand.Text(), event: name, sandboxID: ev.SandboxID}
	d.body, _ = json.Marshal(Payload{ID: d.id, Event: name, Time: ev.Time, SandboxID: ev.SandboxID,
		State: ev.State, Runtime: ev.Runtime, Template: ev.Template, Tenant: ev.Tenant, Error: ev.Error}) // cannot fail
	s.mu.Lock()
	full := len(s.queue) >= s.opts.QueueSize
	first := full && s.dropped == 0
	if full {
		s.queue[0] = delivery{}
		s.queue = s.queue[1:]
		s.dropped++
	}
	s.queue = append(s.queue, d)
	s.mu.Unlock()
	if full {
		s.count("dropped", 1)
	}
	if first {
		s.log.Warn("webhook queue full: dropping the oldest deliveries", "queue", s.opts.QueueSize)
	}
	s.signal()
}

// signal wakes the worker without blocking.
func (s *Sender) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// work delivers queued deliveries in order until Close has been called
// and the queue is empty, or ctx ends.
func (s *Sender) work(ctx context.Context) {
	defer close(s.workerDone)
	for {
		d, ok := s.next(ctx)
		if !ok {
			return
		}
		if !s.deliver(ctx, d) {
			s.mu.Lock()
			s.queue = append([]delivery{d}, s.queue...) // Close counts it as left
			s.mu.Unlock()
			return
		}
	}
}

// next waits for the oldest queued delivery; false means stop.
func (s *Sender) next(ctx context.Context) (delivery, bool) {
	for {
		s.mu.Lock()
		dropped := s.dropped
		s.dropped = 0
		var d delivery
		ok := len(s.queue) > 0
		if ok {
			d = s.queue[0]
			s.queue[0] = delivery{}
			s.queue = s.queue[1:]
		}
		closing := s.closing
		s.mu.Unlock()
		if dropped > 0 {
			s.log.Warn("webhook deliveries dropped: the queue was full", "dropped", dropped)
		}
		if ok {
			return d, true
		}
		if closing {
			return delivery{}, false
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return delivery{}, false
		}
	}
}

// count adds n to the Deliveries counter's result series.
func (s *Sender) count(result string, n int) {
	if s.opts.Deliveries != nil {
		s.opts.Deliveries.Add(float64(n), result)
	}
}

// errURL unwraps the *url.Error of a failed request, whose text repeats
// the URL with any token in its query.
func errURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}
