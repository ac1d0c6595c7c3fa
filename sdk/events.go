package corral

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/url"
	"strings"
	"time"
)

// Event types of the lifecycle stream.
const (
	EventCreated = "created" // recorded; resources are being acquired
	EventRunning = "running" // created and started
	EventPaused  = "paused"
	EventResumed = "resumed"
	EventDeleted = "deleted" // gone (also after a failed create, with Error set)
	EventError   = "error"   // the sandbox entered the error state
	EventTimeout = "timeout" // its deadline passed; a deleted event follows
	EventStopped = "stopped" // its processes ended; its files stay
	EventStarted = "started" // a stopped sandbox runs again
	// EventOOMKilled: the kernel killed a process of the sandbox, or the
	// whole sandbox, for going past its memory limit (once per kill).
	EventOOMKilled = "oom_killed"
)

// Event is one lifecycle change of a sandbox.
type Event struct {
	Type      string    `json:"type"`
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id"`
	// State is the sandbox's state after the change; deleted events carry
	// the last one.
	State    string            `json:"state"`
	Runtime  string            `json:"runtime"`
	Template string            `json:"template"`
	Error    *EventErrorDetail `json:"error,omitempty"`
}

// EventErrorDetail says why a sandbox failed.
type EventErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// EventOptions filter an event stream; zero fields match everything.
type EventOptions struct {
	SandboxID string
	Types     []string
}

// EventStream is an open stream of lifecycle events. It is not safe for
// concurrent use; Close it when done.
type EventStream struct {
	ctx  context.Context
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Events subscribes to lifecycle events and returns once the subscription
// is in place: every change after the call returns is delivered, none
// before. The stream ends when ctx ends, Close is called, or the client
// falls too far behind (Next then returns an *Error with code
// resource_exhausted).
func (c *Client) Events(ctx context.Context, opts EventOptions) (*EventStream, error) {
	q := url.Values{}
	if opts.SandboxID != "" {
		q.Set("sandbox_id", opts.SandboxID)
	}
	if len(opts.Types) > 0 {
		q.Set("type", strings.Join(opts.Types, ","))
	}
	resp, err := c.do(ctx, "GET", "/v1/events", q, nil, "")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	return &EventStream{ctx: ctx, body: resp.Body, sc: sc}, nil
}

// Next waits for the next event. It returns io.EOF when the daemon ended
// the stream, ctx's error when ctx ended, and an *Error when the daemon
// dropped the stream.
func (s *EventStream) Next() (Event, error) {
	if !s.sc.Scan() {
		if err := s.ctx.Err(); err != nil {
			return Event{}, err
		}
		if err := s.sc.Err(); err != nil {
			return Event{}, fmt.Errorf("reading event stream: %w", err)
		}
		return Event{}, io.EOF
	}
	var ev Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return Event{}, fmt.Errorf("decoding event: %w", err)
	}
	if ev.Type == EventError && ev.SandboxID == "" {
		if ev.Error == nil {
			ev.Error = &EventErrorDetail{Code: CodeInternal, Message: "event stream ended without a reason"}
		}
		return Event{}, &Error{Status: 200, Code: ev.Error.Code, Message: ev.Error.Message}
	}
	return ev, nil
}

// All returns the events as an iterator; it stops after the first error
// (io.EOF is not reported) or when the loop breaks, and closes nothing:
// Close the stream after the loop.
func (s *EventStream) All() iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			ev, err := s.Next()
			if err == io.EOF {
				return
			}
			if !yield(ev, err) || err != nil {
				return
			}
		}
	}
}

// Close ends the subscription.
func (s *EventStream) Close() error { return s.body.Close() }

// Metrics returns the daemon's metrics in the Prometheus text format: all
// of them for an admin key, and for a tenant's key the series of its own
// sandboxes only (corral_sandboxes and the per-sandbox series, which carry
// a tenant label).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.do(ctx, "GET", "/metrics", nil, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
