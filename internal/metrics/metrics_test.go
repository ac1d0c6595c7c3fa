package metrics

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteTextParsesBack(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("test_refusals_total", "Refused requests.\nBy reason.", "reason")
	r.Gauge("test_pool_size", "Warm sandboxes.")
	h := r.Histogram("test_create_seconds", "Create latency.", []float64{0.1, 1}, "runtime")
	r.GaugeFunc("test_sandboxes", "Sandboxes by state.", []string{"state"}, func(_ context.Context, emit Emit) {
		emit(3, "running")
		emit(1, `odd "state"\`+"\n")
	})
	c.Inc("capacity")
	c.Add(2, "per_key")
	h.Observe(0.05, "runc")
	h.Observe(0.1, "runc") // on a bound: le is inclusive
	h.Observe(7, "runc")

	var buf bytes.Buffer
	if err := r.WriteText(t.Context(), &buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	s, err := Parse(&buf)
	if err != nil {
		t.Fatalf("parsing our own output: %v\n%s", err, text)
	}
	want := map[string]string{
		"test_refusals_total": "counter", "test_pool_size": "gauge",
		"test_create_seconds": "histogram", "test_sandboxes": "gauge",
	}
	if diff := cmp.Diff(want, s.Types); diff != "" {
		t.Errorf("types (-want +got):\n%s", diff)
	}
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"counter by label", "test_refusals_total", []string{"reason", "capacity"}, 1},
		{"counter add", "test_refusals_total", []string{"reason", "per_key"}, 2},
		{"unlabeled gauge starts at zero", "test_pool_size", nil, 0},
		{"bucket below", "test_create_seconds_bucket", []string{"runtime", "runc", "le", "0.1"}, 2},
		{"bucket cumulative", "test_create_seconds_bucket", []string{"runtime", "runc", "le", "1"}, 2},
		{"bucket inf", "test_create_seconds_bucket", []string{"runtime", "runc", "le", "+Inf"}, 3},
		{"sum", "test_create_seconds_sum", []string{"runtime", "runc"}, 7.15},
		{"count", "test_create_seconds_count", []string{"runtime", "runc"}, 3},
		{"func", "test_sandboxes", []string{"state", "running"}, 3},
		{"escaped label", "test_sandboxes", []string{"state", `odd "state"\` + "\n"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := s.Get(tt.metric, tt.labels...)
			if !ok {
				t.Fatalf("no sample %s %v in\n%s", tt.metric, tt.labels, text)
			}
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("%s %v = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}
	if !strings.Contains(text, `# HELP test_refusals_total Refused requests.\nBy reason.`) {
		t.Errorf("help not escaped:\n%s", text)
	}
}

func TestParseRejectsUndeclaredAndMalformed(t *testing.T) {
	tests := []struct{ name, in string }{
		{"no type", "foo 1\n"},
		{"bad value", "# TYPE foo gauge\nfoo one\n"},
		{"unterminated label", "# TYPE foo gauge\nfoo{a=\"x} 1\n"},
		{"bad escape", "# TYPE foo gauge\nfoo{a=\"\\x\"} 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse(strings.NewReader(tt.in)); err == nil {
				t.Errorf("Parse(%q) succeeded", tt.in)
			}
		})
	}
}

func TestRegistryPanicsOnMisuse(t *testing.T) {
	tests := []struct {
		name string
		f    func(r *Registry)
	}{
		{"duplicate", func(r *Registry) { r.Gauge("a", ""); r.Counter("a", "") }},
		{"bad name", func(r *Registry) { r.Gauge("1a", "") }},
		{"label count", func(r *Registry) { r.Counter("a_total", "", "x").Inc() }},
		{"counter down", func(r *Registry) { r.Counter("a_total", "").Add(-1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			tt.f(NewRegistry())
		})
	}
}

func TestConcurrentUpdates(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("c_total", "", "k")
	h := r.Histogram("h_seconds", "", nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Inc([]string{"a", "b"}[i%2])
				h.Observe(0.002)
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if err := r.WriteText(context.Background(), &bytes.Buffer{}); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	if got := c.Value("a") + c.Value("b"); got != 8000 {
		t.Errorf("count = %v, want 8000", got)
	}
	if got := h.Count(); got != 8000 {
		t.Errorf("observations = %v, want 8000", got)
	}
}

// BenchmarkObserve is the cost a latency observation adds to a create or
// an exec.
func BenchmarkObserve(b *testing.B) {
	h := NewRegistry().Histogram("h_seconds", "", nil, "runtime")
	for b.Loop() {
		h.Observe(0.003, "runc")
	}
}

// BenchmarkWriteText is a scrape of 1000 sandboxes' worth of series.
func BenchmarkWriteText(b *testing.B) {
	r := NewRegistry()
	g := r.Gauge("g_bytes", "", "sandbox_id", "runtime")
	h := r.Histogram("h_seconds", "", nil, "runtime")
	for i := range 1000 {
		g.Set(float64(i), strconv.Itoa(i), "runc")
	}
	h.Observe(0.01, "runc")
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := r.WriteText(context.Background(), &buf); err != nil {
			b.Fatal(err)
		}
	}
}

func TestWriteFamilies(t *testing.T) {
	r := NewRegistry()
	r.Gauge("test_a", "A.")
	r.Gauge("test_b", "B.")
	r.Counter("test_c_total", "C.")
	var buf bytes.Buffer
	if err := r.WriteFamilies(t.Context(), &buf, []string{"test_c_total", "test_a", "test_unknown", "test_a"}); err != nil {
		t.Fatal(err)
	}
	s, err := Parse(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	want := map[string]string{"test_a": "gauge", "test_c_total": "counter"}
	if diff := cmp.Diff(want, s.Types); diff != "" {
		t.Errorf("families written (-want +got):\n%s", diff)
	}
}
