package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkCode1Plus1 is `1+1` on a warm Python context of a runc
// code-interpreter sandbox, through the daemon (REST and the port path
// into the sandbox), against its peer: the same round trip straight to a
// Python kernel in the same sandbox (`/.corral/agent interpreter
// --bench-bare`), without HTTP or the daemon. It reports both p50s and
// their ratio.
func BenchmarkCode1Plus1(b *testing.B) {
	d := codeDaemon(b)
	ctx := b.Context()
	sb := d.create(b, corral.CreateOptions{Template: "code-interpreter", MemoryMB: 1024})
	var samples []time.Duration
	for b.Loop() {
		begin := time.Now()
		x, err := d.Client.RunCode(ctx, sb.ID, "1+1", corral.CodeOptions{})
		if err != nil || x.Text() != "2" {
			b.Fatalf("1+1: %v %+v", err, x)
		}
		samples = append(samples, time.Since(begin))
	}
	p50 := reportPercentiles(b, "", samples)
	out, res := d.execOut(b, sb.ID, "/.corral/agent interpreter --user user --bench-bare 200")
	us, err := strconv.Atoi(strings.TrimSpace(out))
	if res.ExitCode != 0 || err != nil {
		b.Fatalf("bare kernel round trips: exit %d: %s", res.ExitCode, out)
	}
	b.ReportMetric(float64(us)/1000, "peer-p50-ms")
	b.ReportMetric(float64(p50.Microseconds())/float64(us), "ratio-p50")
}

// BenchmarkCodeWarmClaim is a create served by a warm pool of
// code-interpreter sandboxes (runc) up to the result of its first
// execution: the default context is already running in pool members.
func BenchmarkCodeWarmClaim(b *testing.B) {
	d := codeDaemon(b)
	ctx := b.Context()
	d.removePoolAtCleanup(b, "ci")
	if _, err := d.Client.SetPool(ctx, "ci", corral.PoolOptions{Template: "code-interpreter", MemoryMB: 1024, Size: 2}); err != nil {
		b.Fatal(err)
	}
	var samples []time.Duration
	for b.Loop() {
		b.StopTimer()
		d.waitPoolFull(b, "ci")
		b.StartTimer()
		begin := time.Now()
		sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "code-interpreter", MemoryMB: 1024})
		if err != nil {
			b.Fatal(err)
		}
		x, err := d.Client.RunCode(ctx, sb.ID, "1+1", corral.CodeOptions{})
		if err != nil || x.Text() != "2" {
			b.Fatalf("1+1: %v %+v", err, x)
		}
		samples = append(samples, time.Since(begin))
		b.StopTimer()
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportPercentiles(b, "", samples)
}
