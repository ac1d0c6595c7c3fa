package corral

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A dropped stream's final error event becomes an *Error; a refusal's
// Retry-After header becomes Error.RetryAfter.
func TestEventsAndRefusals(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/events":
			if got := r.URL.Query().Get("type"); got != "created,deleted" {
				t.Errorf("type query = %q", got)
			}
			fmt.Fprintln(w, `{"type":"created","time":"2026-11-30T03:00:00Z","sandbox_id":"a","state":"creating"}`)
			fmt.Fprintln(w, `{"type":"error","time":"2026-11-30T03:00:01Z","error":{"code":"resource_exhausted","message":"dropped"}}`)
		case "/v1/sandboxes":
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, `{"error":{"code":"busy","message":"full"}}`)
		}
	}))
	defer ts.Close()
	c, err := New(ts.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Events(t.Context(), EventOptions{Types: []string{EventCreated, EventDeleted}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	var last error
	for ev, err := range s.All() {
		if err != nil {
			last = err
			break
		}
		got = append(got, ev.Type+" "+ev.SandboxID)
	}
	if len(got) != 1 || got[0] != "created a" {
		t.Errorf("events = %q", got)
	}
	if ErrorCode(last) != CodeResourceExhausted {
		t.Errorf("end of a dropped stream: %v", last)
	}

	_, err = c.Create(t.Context(), CreateOptions{Template: "x"})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBusy || e.Status != 503 {
		t.Fatalf("create: %#v", err)
	}
	if d, ok := RetryAfter(err); !ok || d != 3*time.Second {
		t.Errorf("RetryAfter = %v %v", d, ok)
	}
}
