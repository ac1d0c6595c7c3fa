package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/testutil"
)

// request is one request a receiver got.
type request struct {
	header http.Header
	body   []byte
	at     time.Time
}

// receiver is a webhook endpoint on loopback that records requests and
// answers the nth (from 1) with answer, or 204 when answer is nil.
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []request
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter)) *receiver {
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, request{header: r.Header.Clone(), body: body, at: time.Now()})
		n := len(rc.got)
		rc.mu.Unlock()
		if answer == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		answer(n, w)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.got...)
}

// payloads decodes the bodies received, in order.
func (rc *receiver) payloads(t *testing.T) []Payload {
	t.Helper()
	var ps []Payload
	for _, r := range rc.requests() {
		var p Payload
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatalf("body %q: %v", r.body, err)
		}
		ps = append(ps, p)
	}
	return ps
}

// sandboxIDs are the sandbox IDs of the payloads received, in order.
func (rc *receiver) sandboxIDs(t *testing.T) []string {
	var ids []string
	for _, p := range rc.payloads(t) {
		ids = append(ids, p.SandboxID)
	}
	return ids
}

// start starts a Sender on bus with fast retries, closed at the end of t
// if the test does not close it.
func start(t *testing.T, bus *events.Bus, opts Options) *Sender {
	t.Helper()
	if opts.minBackoff == 0 {
		opts.minBackoff = time.Millisecond
	}
	if opts.maxBackoff == 0 {
		opts.maxBackoff = 10 * time.Millisecond
	}
	s, err := New(bus, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// closeSender closes s and fails t if anything was left undelivered.
func closeSender(t *testing.T, s *Sender) {
	t.Helper()
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func deliveries() *metrics.Counter {
	return metrics.NewRegistry().Counter("corral_webhook_deliveries_total", "test", "result")
}

func sandboxEvent(typ, id string) events.Event {
	return events.Event{Type: typ, SandboxID: id, State: "running", Runtime: "runc", Template: "bb"}
}

func TestPayloadAndSignature(t *testing.T) {
	for _, secret := range []string{"s3cret", ""} {
		t.Run("secret="+secret, func(t *testing.T) {
			rc := newReceiver(t, nil)
			bus := events.NewBus(0)
			s := start(t, bus, Options{URL: rc.URL + "/hook?token=x", Secret: secret, Version: "1.2.3"})
			at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
			bus.Publish(events.Event{Type: events.Error, Time: at, SandboxID: "sb1", State: "error", Runtime: "runc",
				Template: "bb", Error: &events.ErrorDetail{Code: "internal", Message: "agent gone"}})
			closeSender(t, s)

			reqs := rc.requests()
			if len(reqs) != 1 {
				t.Fatalf("got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			var p Payload
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatal(err)
			}
			want := Payload{ID: p.ID, Event: "failed", Time: at, SandboxID: "sb1", State: "error", Runtime: "runc",
				Template: "bb", Error: &events.ErrorDetail{Code: "internal", Message: "agent gone"}}
			if diff := cmp.Diff(want, p); diff != "" {
				t.Errorf("payload (-want +got):\n%s", diff)
			}
			for name, want := range map[string]string{
				"Content-Type":      "application/json",
				"User-Agent":        "corral/1.2.3",
				"X-Corral-Event":    "failed",
				"X-Corral-Delivery": p.ID,
			} {
				if got := r.header.Get(name); got != want || want == "" {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			ts, err := strconv.ParseInt(r.header.Get("X-Corral-Timestamp"), 10, 64)
			if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
				t.Errorf("X-Corral-Timestamp = %q, want the time of the request", r.header.Get("X-Corral-Timestamp"))
			}
			sig := r.header.Get("X-Corral-Signature")
			if secret == "" {
				if sig != "" {
					t.Errorf("unsigned sender sent X-Corral-Signature %q", sig)
				}
				return
			}
			// What a receiver does, written out rather than through Sign.
			mac := hmac.New(sha256.New, []byte(secret))
			mac.Write([]byte(r.header.Get("X-Corral-Timestamp") + "." + string(r.body)))
			if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); !hmac.Equal([]byte(sig), []byte(want)) {
				t.Errorf("X-Corral-Signature = %q, want %q", sig, want)
			}
		})
	}
}

func TestEventNames(t *testing.T) {
	rc := newReceiver(t, nil)
	bus := events.NewBus(0)
	s := start(t, bus, Options{URL: rc.URL})
	tests := []struct{ typ, want string }{
		{events.Created, "created"},
		{events.Running, "running"},
		{events.Paused, "paused"},
		{events.Resumed, "resumed"},
		{events.Stopped, "stopped"},
		{events.Started, "started"},
		{events.Timeout, "expired"},
		{events.Deleted, "deleted"},
		{events.Error, "failed"},
		{events.OOMKilled, "oom_killed"},
	}
	var want []string
	for _, tt := range tests {
		bus.Publish(sandboxEvent(tt.typ, "sb"))
		want = append(want, tt.want)
	}
	bus.Publish(events.Event{Type: events.Running}) // stream-level: not sent
	bus.Publish(sandboxEvent("rebooted", "sb"))     // no such type: not sent
	closeSender(t, s)

	var got []string
	for i, r := range rc.requests() {
		got = append(got, r.header.Get("X-Corral-Event"))
		if p := rc.payloads(t)[i]; p.Event != got[i] {
			t.Errorf("payload event %q, header %q", p.Event, got[i])
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name     string
		statuses []int // answers in order; the last one repeats
		attempts int   // Options.attempts (0: the default)
		want     string
		wantReqs int
	}{
		{name: "500 then ok", statuses: []int{500, 502, 200}, want: "ok", wantReqs: 3},
		{name: "429 then ok", statuses: []int{429, 201}, want: "ok", wantReqs: 2},
		{name: "400 is final", statuses: []int{400}, want: "failed", wantReqs: 1},
		{name: "a redirect is final", statuses: []int{302}, want: "failed", wantReqs: 1},
		{name: "out of attempts", statuses: []int{503}, attempts: 3, want: "failed", wantReqs: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := newReceiver(t, func(n int, w http.ResponseWriter) {
				if tt.statuses[0] == 302 {
					w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
				}
				w.WriteHeader(tt.statuses[min(n, len(tt.statuses))-1])
			})
			bus := events.NewBus(0)
			c := deliveries()
			s := start(t, bus, Options{URL: rc.URL, Deliveries: c, attempts: tt.attempts})
			bus.Publish(sandboxEvent(events.Created, "sb"))
			closeSender(t, s)

			reqs := rc.requests()
			if len(reqs) != tt.wantReqs {
				t.Fatalf("got %d requests, want %d", len(reqs), tt.wantReqs)
			}
			for _, r := range reqs {
				if string(r.body) != string(reqs[0].body) || r.header.Get("X-Corral-Delivery") != reqs[0].header.Get("X-Corral-Delivery") {
					t.Errorf("a retry differs from the first attempt: %q %q", r.body, reqs[0].body)
				}
			}
			for _, result := range []string{"ok", "failed", "dropped"} {
				want := 0.0
				if result == tt.want {
					want = 1
				}
				if got := c.Value(result); got != want {
					t.Errorf("deliveries{result=%q} = %v, want %v", result, got, want)
				}
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	rc := newReceiver(t, func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	bus := events.NewBus(0)
	// Backoff alone waits a millisecond; Retry-After asks for a second,
	// which the longest backoff caps to 200 ms.
	s := start(t, bus, Options{URL: rc.URL, maxBackoff: 200 * time.Millisecond})
	bus.Publish(sandboxEvent(events.Created, "sb"))
	closeSender(t, s)
	reqs := rc.requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want 2", len(reqs))
	}
	if gap := reqs[1].at.Sub(reqs[0].at); gap < 200*time.Millisecond {
		t.Errorf("retried after %v, want at least the 200 ms Retry-After was capped to", gap)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name, v string
		want    time.Duration
	}{
		{"absent", "", 0},
		{"seconds", "7", 7 * time.Second},
		{"negative", "-3", 0},
		{"date", now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"past date", now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{"garbage", "soon", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseRetryAfter(tt.v, now); got != tt.want {
				t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	s := &Sender{opts: Options{minBackoff: time.Second, maxBackoff: time.Minute}}
	for attempt, full := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, time.Minute, time.Minute} {
		if got := s.backoff(attempt + 1); got < full/2 || got > full {
			t.Errorf("backoff(%d) = %v, want within [%v, %v]", attempt+1, got, full/2, full)
		}
	}
}

func TestQueueOverflowDropsOldest(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter) {
		if n == 1 {
			close(arrived)
			<-release
		}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	bus := events.NewBus(0)
	c := deliveries()
	s := start(t, bus, Options{URL: rc.URL, QueueSize: 3, Deliveries: c})
	bus.Publish(sandboxEvent(events.Created, "sb0"))
	<-arrived // sb0 is in flight, and stays there
	for i := 1; i <= 6; i++ {
		bus.Publish(sandboxEvent(events.Created, "sb"+strconv.Itoa(i)))
	}
	testutil.WaitFor(t, func() bool { return c.Value("dropped") == 3 })
	if bus.Subscribers() != 1 {
		t.Errorf("the bus dropped the sender: it did not keep reading while delivery was stuck")
	}
	close(release)
	closeSender(t, s)
	if diff := cmp.Diff([]string{"sb0", "sb4", "sb5", "sb6"}, rc.sandboxIDs(t)); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
	if c.Value("ok") != 4 || c.Value("dropped") != 3 {
		t.Errorf("deliveries: ok %v, dropped %v; want 4 and 3", c.Value("ok"), c.Value("dropped"))
	}
}

func TestCloseDeliversPending(t *testing.T) {
	rc := newReceiver(t, func(n int, w http.ResponseWriter) { time.Sleep(5 * time.Millisecond) })
	bus := events.NewBus(0)
	s := start(t, bus, Options{URL: rc.URL})
	var want []string
	for i := range 10 {
		id := "sb" + strconv.Itoa(i)
		bus.Publish(sandboxEvent(events.Created, id))
		want = append(want, id)
	}
	closeSender(t, s)
	bus.Publish(sandboxEvent(events.Created, "after-close"))
	if err := s.Close(t.Context()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if diff := cmp.Diff(want, rc.sandboxIDs(t)); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
	if bus.Subscribers() != 0 {
		t.Errorf("%d subscribers after Close", bus.Subscribers())
	}
}

func TestCloseGivesUpWhenCtxEnds(t *testing.T) {
	rc := newReceiver(t, func(n int, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	bus := events.NewBus(0)
	c := deliveries()
	s := start(t, bus, Options{URL: rc.URL, Deliveries: c, minBackoff: time.Hour, maxBackoff: time.Hour})
	bus.Publish(sandboxEvent(events.Created, "sb1"))
	bus.Publish(sandboxEvent(events.Created, "sb2"))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err := s.Close(ctx)
	if err == nil || !strings.Contains(err.Error(), "2 deliveries left undelivered") {
		t.Errorf("Close = %v, want 2 deliveries left undelivered", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Close took %v after its context ended", d)
	}
	if c.Value("dropped") != 2 || c.Value("failed") != 0 {
		t.Errorf("deliveries: dropped %v, failed %v; want 2 and 0", c.Value("dropped"), c.Value("failed"))
	}
}

func TestResubscribesWhenDropped(t *testing.T) {
	rc := newReceiver(t, nil)
	var logs testutil.SyncBuffer
	bus := events.NewBus(1)
	s := start(t, bus, Options{URL: rc.URL, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	// Holding the queue's lock stops the reader after at most one event,
	// so the bus, with room for one, drops the subscription.
	s.mu.Lock()
	for i := range 4 {
		bus.Publish(sandboxEvent(events.Created, "lost"+strconv.Itoa(i)))
	}
	if n := bus.Subscribers(); n != 0 {
		t.Fatalf("%d subscribers, want the sender dropped", n)
	}
	s.mu.Unlock()
	testutil.WaitFor(t, func() bool { return bus.Subscribers() == 1 })
	bus.Publish(sandboxEvent(events.Created, "after"))
	closeSender(t, s)
	ids := rc.sandboxIDs(t)
	if len(ids) == 0 || ids[len(ids)-1] != "after" {
		t.Errorf("delivered %v, want the event after the new subscription last", ids)
	}
	if !strings.Contains(logs.String(), "subscribing again") || !strings.Contains(logs.String(), "fell 1 events behind") {
		t.Errorf("log does not say what happened:\n%s", logs.String())
	}
}

func TestCheckURL(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8080/hook", true},
		{"https://hooks.example.com/corral?token=x", true},
		{"ftp://example.com/hook", false},
		{"example.com/hook", false},
		{"http:///hook", false},
		{"https://", false},
		{"http://[::1", false},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			if err := CheckURL(tt.url); (err == nil) != tt.ok {
				t.Errorf("CheckURL(%q) = %v, want ok %v", tt.url, err, tt.ok)
			}
		})
	}
}

func TestLogsHideQuery(t *testing.T) {
	var logs testutil.SyncBuffer
	bus := events.NewBus(0)
	s := start(t, bus, Options{URL: "http://user:pw@127.0.0.1:1/hook?token=hidden", attempts: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	bus.Publish(sandboxEvent(events.Created, "sb"))
	closeSender(t, s)
	if out := logs.String(); !strings.Contains(out, "webhook delivery failed") || strings.Contains(out, "hidden") || strings.Contains(out, "pw") {
		t.Errorf("log:\n%s", out)
	}
}
