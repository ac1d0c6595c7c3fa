package server

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

func TestAdmissionRefusalsOverHTTP(t *testing.T) {
	tests := []struct {
		name   string
		adm    admission.Config
		status int
		code   string
		retry  time.Duration // whole seconds, rounded up
	}{
		{"per key", admission.Config{MaxPerPrincipal: 1}, 429, corral.CodeResourceExhausted, time.Second},
		{"capacity", admission.Config{MaxSandboxes: 1, RetryAfter: 1500 * time.Millisecond}, 503, corral.CodeBusy, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestServer(t, "k", func(cfg *sandbox.Config) { cfg.Admission = tt.adm })
			if _, err := c.Create(t.Context(), corral.CreateOptions{Template: "bb"}); err != nil {
				t.Fatal(err)
			}
			_, err := c.Create(t.Context(), corral.CreateOptions{Template: "bb"})
			var e *corral.Error
			if !errors.As(err, &e) || e.Status != tt.status || e.Code != tt.code {
				t.Fatalf("create over the limit: %#v, want %d %s", err, tt.status, tt.code)
			}
			if d, ok := corral.RetryAfter(err); !ok || d != tt.retry {
				t.Errorf("RetryAfter = %v %v, want %v", d, ok, tt.retry)
			}
		})
	}
}

func TestEventsAndMetricsOverHTTP(t *testing.T) {
	c, _ := newTestServer(t, "k", func(cfg *sandbox.Config) { cfg.Admission = admission.Config{MaxSandboxes: 1} })
	ctx := t.Context()
	if _, err := c.Events(ctx, corral.EventOptions{Types: []string{"bogus"}}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("unknown event type: %v", err)
	}
	all, err := c.Events(ctx, corral.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	only, err := c.Events(ctx, corral.EventOptions{SandboxID: sb.ID, Types: []string{corral.EventDeleted}})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if _, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true", Stdout: io.Discard}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, corral.CreateOptions{Template: "bb"}); corral.ErrorCode(err) != corral.CodeBusy {
		t.Fatalf("second create: %v, want busy", err)
	}

	text, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scrape, err := metrics.Parse(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, text)
	}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"corral_sandboxes", []string{"state", "running", "runtime", "fake"}, 1},
		{"corral_create_seconds_count", []string{"runtime", "fake"}, 1},
		{"corral_exec_start_seconds_count", []string{"runtime", "fake"}, 1},
		{"corral_admission_refusals_total", []string{"reason", admission.RefusedSandboxes}, 1},
		{"corral_admission_committed", []string{"resource", "memory_bytes"}, 128 << 20},
		{"corral_pool_misses_total", nil, 0},
		{"corral_pool_hits_total", nil, 0},
	}
	for _, ck := range checks {
		if got, ok := scrape.Get(ck.name, ck.labels...); !ok || got != ck.want {
			t.Errorf("%s%v = %v (found %v), want %v", ck.name, ck.labels, got, ok, ck.want)
		}
	}
	if _, ok := scrape.Get("corral_sandbox_memory_bytes", "sandbox_id", sb.ID); !ok {
		t.Errorf("no memory sample of %s in\n%s", sb.ID, text)
	}

	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		ev, err := all.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.SandboxID != sb.ID || ev.Runtime != "fake" || ev.Template != "bb" {
			t.Errorf("event %+v", ev)
		}
		got = append(got, ev.Type)
	}
	if diff := cmp.Diff([]string{"created", "running", "deleted"}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	ev, err := only.Next()
	if err != nil || ev.Type != corral.EventDeleted || ev.SandboxID != sb.ID {
		t.Errorf("filtered stream: %+v %v", ev, err)
	}
}
