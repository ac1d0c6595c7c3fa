package corral

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAudit(t *testing.T) {
	const (
		create = `{"time":"2026-11-30T03:00:00.5Z","tenant":"acme","key":"ci","action":"POST /v1/sandboxes","sandbox_id":"sb1","status":201,"duration_ms":12.5,"detail":{"template":"default"}}`
		exec   = `{"time":"2026-11-30T03:00:01Z","tenant":"acme","key":"ci","action":"exec","sandbox_id":"sb1","argv":["sh","-c","exit 7"],"exit_code":7}`
		failed = `{"error":{"code":"resource_exhausted","message":"fell behind"}}`
	)
	seven := 7
	records := []AuditRecord{
		{Time: time.Date(2026, 11, 30, 3, 0, 0, 5e8, time.UTC), Tenant: "acme", Key: "ci", Action: "POST /v1/sandboxes",
			SandboxID: "sb1", Status: 201, DurationMS: 12.5, Detail: map[string]string{"template": "default"}},
		{Time: time.Date(2026, 11, 30, 3, 0, 1, 0, time.UTC), Tenant: "acme", Key: "ci", Action: "exec",
			SandboxID: "sb1", Argv: []string{"sh", "-c", "exit 7"}, ExitCode: &seven},
	}
	tests := []struct {
		name      string
		opts      AuditOptions
		lines     []string
		wantQuery string
		want      []AuditRecord
		wantCode  string // of an *Error
		wantErr   bool
	}{
		{"everything", AuditOptions{}, []string{create, exec}, "", records, "", false},
		{"filters", AuditOptions{SandboxID: "sb1", Key: "ci", Since: time.Date(2026, 11, 30, 4, 0, 0, 0, time.FixedZone("CET", 3600))},
			[]string{create}, "key=ci&sandbox=sb1&since=2026-11-30T03%3A00%3A00Z", records[:1], "", false},
		{"an error line ends the stream", AuditOptions{Follow: true}, []string{create, failed, exec}, "follow=true", records[:1], "resource_exhausted", false},
		{"a followed stream the daemon ends", AuditOptions{Follow: true}, []string{create}, "follow=true", records[:1], "", true},
		{"a line that is no record", AuditOptions{}, []string{create, "nonsense"}, "", records[:1], "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/audit" || r.URL.RawQuery != tt.wantQuery {
					t.Errorf("request %s", r.URL)
				}
				w.Header().Set("Content-Type", "application/x-ndjson")
				for _, l := range tt.lines {
					fmt.Fprintln(w, l)
				}
			}))
			defer ts.Close()
			c, err := New(ts.URL, "")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var got []AuditRecord
			err = c.Audit(t.Context(), tt.opts, func(r AuditRecord) error { got = append(got, r); return nil })
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			switch {
			case tt.wantCode != "":
				var e *Error
				if !errors.As(err, &e) || e.Code != tt.wantCode {
					t.Errorf("Audit = %v, want an *Error with code %s", err, tt.wantCode)
				}
			case (err != nil) != tt.wantErr:
				t.Errorf("Audit = %v, want an error: %v", err, tt.wantErr)
			}
		})
	}
}

// A follow ends with its context; the error of fn ends a call.
func TestAuditEnds(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"time":"2026-11-30T03:00:00Z","action":"exec"}`)
		fmt.Fprintln(w, `{"time":"2026-11-30T03:00:01Z","action":"exec"}`)
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("follow") == "true" {
			<-r.Context().Done()
		}
	}))
	defer ts.Close()
	c, err := New(ts.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(t.Context())
	err = c.Audit(ctx, AuditOptions{Follow: true}, func(AuditRecord) error { cancel(); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled follow: %v", err)
	}

	stop := errors.New("stop")
	n := 0
	err = c.Audit(t.Context(), AuditOptions{}, func(AuditRecord) error { n++; return stop })
	if err != stop || n != 1 {
		t.Errorf("Audit = %v after %d records, want the error of fn after one", err, n)
	}
}
