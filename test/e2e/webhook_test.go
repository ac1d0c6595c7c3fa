package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

// hookRequest is what the test's receiver made of one webhook request.
type hookRequest struct {
	Event     string `json:"event"`
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	Runtime   string `json:"runtime"`
	Template  string `json:"template"`
	// problem is what is wrong with the request's headers or signature.
	problem string
}

// TestWebhook runs a daemon with --webhook pointing at a receiver in the
// test, on loopback, and checks that the life of a sandbox arrives there
// in order, each request signed as docs say a receiver verifies it.
func TestWebhook(t *testing.T) {
	const secret = "webhook-test-secret"
	var (
		mu  sync.Mutex
		got []hookRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var h hookRequest
		if err := json.Unmarshal(body, &h); err != nil {
			h.problem = "body: " + err.Error()
		}
		ts := r.Header.Get("X-Corral-Timestamp")
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + string(body)))
		sec, err := strconv.ParseInt(ts, 10, 64)
		switch {
		case r.URL.Path != "/hook" || r.Method != http.MethodPost:
			h.problem = r.Method + " " + r.URL.Path
		case !hmac.Equal([]byte(r.Header.Get("X-Corral-Signature")), []byte("sha256="+hex.EncodeToString(mac.Sum(nil)))):
			h.problem = "bad signature " + r.Header.Get("X-Corral-Signature")
		case err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute:
			h.problem = "timestamp " + ts
		case r.Header.Get("X-Corral-Event") != h.Event || r.Header.Get("X-Corral-Delivery") != h.ID:
			h.problem = "headers " + r.Header.Get("X-Corral-Event") + " " + r.Header.Get("X-Corral-Delivery")
		}
		mu.Lock()
		got = append(got, h)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close) // after the daemon, which posts to it until it stops
	d := startDaemon(t, e2eStorage, "--webhook", srv.URL+"/hook", "--webhook-secret", secret)
	ctx := t.Context()

	sb := d.create(t, corral.CreateOptions{})
	if _, err := d.Client.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Resume(ctx, sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// The sandbox's events, in order; running follows created.
	var (
		events []string
		reqs   []hookRequest
	)
	deadline := time.Now().Add(30 * time.Second)
	for ; ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		reqs = append([]hookRequest(nil), got...)
		mu.Unlock()
		events = nil
		for _, h := range reqs {
			if h.problem != "" {
				t.Fatalf("webhook request %+v: %s", h, h.problem)
			}
			if h.SandboxID == sb.ID {
				events = append(events, h.Event)
				if h.Runtime != "runc" || h.Template != "bb" || h.State == "" {
					t.Errorf("request %+v", h)
				}
			}
		}
		if n := len(events); n > 0 && events[n-1] == "deleted" || time.Now().After(deadline) {
			break
		}
	}
	if diff := cmp.Diff([]string{"created", "running", "paused", "resumed", "deleted"}, events); diff != "" {
		t.Fatalf("webhook events of %s (-want +got):\n%s\nlogs:\n%s", sb.ID, diff, d.Logs())
	}
	waitMetric(t, d.Client, "corral_webhook_deliveries_total", []string{"result", "ok"}, float64(len(reqs)))
}
