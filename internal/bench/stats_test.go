package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name    string
		samples []time.Duration
		q       float64
		want    time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median odd", ms(3, 1, 2), 0.5, 2 * time.Millisecond},
		{"median even takes lower", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"p99 of 50 is max", ms(seq(50)...), 0.99, 50 * time.Millisecond},
		{"p0 is min", ms(5, 9, 2), 0, 2 * time.Millisecond},
		{"p100 is max", ms(5, 9, 2), 1, 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.samples...)
			if got := Percentile(tt.samples, tt.q); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.samples, tt.q, got, tt.want)
			}
			if diff := cmp.Diff(in, tt.samples); diff != "" {
				t.Errorf("Percentile modified its input (-before +after):\n%s", diff)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[n-1-i] = i + 1 // descending, so sorting matters
	}
	return out
}

func TestRatio(t *testing.T) {
	if got := Ratio(3*time.Millisecond, 2*time.Millisecond); got != 1.5 {
		t.Errorf("Ratio = %v, want 1.5", got)
	}
	if got := Ratio(time.Second, 0); got != 0 {
		t.Errorf("Ratio with zero denominator = %v, want 0", got)
	}
}

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"normal", "Name:\tcorral\nVmPeak:\t 9 kB\nVmRSS:\t   51200 kB\nThreads: 9\n", 51200 << 10, false},
		{"missing", "Name:\tcorral\n", 0, true},
		{"bad unit", "VmRSS:\t12 MB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseVmRSS = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		host   string
		want   string
		wantOK bool
	}{
		{"", "/run/corral/corral.sock", true},
		{"unix:///tmp/c.sock", "/tmp/c.sock", true},
		{"unix://", "", false},
		{"http://127.0.0.1:8080", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, ok := SocketPath(tt.host)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("SocketPath(%q) = %q, %v; want %q, %v", tt.host, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestFmtCounts(t *testing.T) {
	if got, want := fmtCounts(nil), "none"; got != want {
		t.Errorf("fmtCounts(nil) = %q, want %q", got, want)
	}
	got := fmtCounts(map[string]int{"unavailable": 2, "resource_exhausted": 5})
	if want := "resource_exhausted=5 unavailable=2"; got != want {
		t.Errorf("fmtCounts = %q, want %q", got, want)
	}
}

func testReport() Report {
	p50, p99 := 1.25, 3.5
	return Report{
		Command:   "corral bench --iterations 2",
		Timestamp: time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC),
		Rows: []Row{
			{Scenario: ScenarioExec, Runtime: "runc", N: 2, P50MS: &p50, P99MS: &p99},
			{Scenario: ScenarioWarm, Runtime: "runc", Extra: "n/a (pools not implemented)"},
			{Scenario: ScenarioPeer, Runtime: "runc", N: 2, P50MS: &p50, P99MS: &p99, Extra: "a | b"},
		},
		Notes: []string{"peer bwrap skipped: not installed"},
	}
}

func TestPrintTable(t *testing.T) {
	var b bytes.Buffer
	if err := PrintTable(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	want := `SCENARIO                    RUNTIME  N  P50      P99      EXTRA
exec round trip             runc     2  1.25 ms  3.50 ms  
warm claim to first output  runc     0  -        -        n/a (pools not implemented)
peer cold start             runc     2  1.25 ms  3.50 ms  a | b
note: peer bwrap skipped: not installed
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestPrintMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := PrintMarkdown(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	want := `| scenario | runtime | n | p50 | p99 | extra |
| --- | --- | --- | --- | --- | --- |
| exec round trip | runc | 2 | 1.25 ms | 3.50 ms |  |
| warm claim to first output | runc | 0 | - | - | n/a (pools not implemented) |
| peer cold start | runc | 2 | 1.25 ms | 3.50 ms | a \| b |

Note: peer bwrap skipped: not installed
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("markdown (-want +got):\n%s", diff)
	}
}

func TestPrintJSON(t *testing.T) {
	var b bytes.Buffer
	if err := PrintJSON(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	rows := got["rows"].([]any)
	warm := rows[1].(map[string]any)
	// A scenario without samples has null latencies, never a number.
	if warm["p50_ms"] != nil || warm["p99_ms"] != nil {
		t.Errorf("warm row latencies = %v, %v; want null", warm["p50_ms"], warm["p99_ms"])
	}
	if got["command"] != "corral bench --iterations 2" || got["timestamp"] != "2026-11-30T01:02:03Z" {
		t.Errorf("command/timestamp = %v, %v", got["command"], got["timestamp"])
	}
	if exec := rows[0].(map[string]any); exec["p50_ms"] != 1.25 {
		t.Errorf("exec p50_ms = %v, want 1.25", exec["p50_ms"])
	}
}

func TestLatencyRow(t *testing.T) {
	r := latencyRow(ScenarioCold, "gvisor", []time.Duration{2 * time.Millisecond, 1234567 * time.Nanosecond})
	if r.N != 2 || *r.P50MS != 1.23 || *r.P99MS != 2 {
		t.Errorf("latencyRow = n %d p50 %v p99 %v; want 2, 1.23, 2", r.N, *r.P50MS, *r.P99MS)
	}
	if r := latencyRow(ScenarioCold, "runc", nil); r.P50MS != nil || r.P99MS != nil {
		t.Errorf("latencyRow without samples has latencies %v %v", r.P50MS, r.P99MS)
	}
}
