package agentserver_test

import (
	"slices"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/wire"
)

// BenchmarkExecRoundTrip measures one exec of /bin/true through the client
// and the server over a unix socket: request, fork/exec, start event, exit
// event. It reports p50 and p99 besides the mean.
func BenchmarkExecRoundTrip(b *testing.B) {
	a := startAgent(b)
	req := wire.ExecRequest{Cmd: []string{"/bin/true"}}
	fn := func(wire.ExecEvent) error { return nil }
	var durations []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		if err := a.client.Exec(b.Context(), req, fn); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(start))
	}
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds()), "p99-ns")
}
