package e2e

import (
	"context"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkColdStartStorages is BenchmarkColdStart with one daemon per
// storage backend, interleaved: each iteration makes a cold create to the
// first byte of `echo hi` on every backend in turn, each followed by its
// delete and a bare `runc run` of the same rootfs, as in
// BenchmarkColdStart. Backends measured one after the other see different
// host noise, which can exceed the difference between them; interleaved,
// they see the same.
// It reports each backend's p50 and p99 and its ratio to bare runc.
//
//	go test -run '^$' -bench ColdStartStorages -benchtime 60x ./test/e2e
func BenchmarkColdStartStorages(b *testing.B) {
	names := storages()
	daemons := make([]*daemon, len(names))
	for i, s := range names {
		daemons[i] = startDaemon(b, s)
	}
	bundle := bareBundle(b)
	ctx := context.Background()
	samples := make([][]time.Duration, len(names))
	var bare []time.Duration
	for b.Loop() {
		for i, d := range daemons {
			fo := &firstOutput{start: time.Now()}
			sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb"})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: fo}); err != nil {
				b.Fatal(err)
			}
			samples[i] = append(samples[i], fo.at)
			if err := d.Client.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			bare = append(bare, bareRuncRun(b, bundle))
		}
	}
	r := reportPercentiles(b, "runc-", bare)
	for i, s := range names {
		c := reportPercentiles(b, s+"-", samples[i])
		if r > 0 {
			b.ReportMetric(float64(c)/float64(r), s+"-ratio-p50")
		}
	}
}
