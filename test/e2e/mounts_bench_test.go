package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkColdStartMounts measures what mounts add to a cold create: in
// one run, alternating sample by sample, a one-call run of `echo hi` to
// its first output byte without mounts (the peer), with one ro mount, one
// rw mount, one cow mount of a directory of 10,000 files, and one rw mount
// of a named volume. It reports each p50 and each one's difference to the
// peer's.
//
//	go test -run '^$' -bench ColdStartMounts -benchtime 50x ./test/e2e
func BenchmarkColdStartMounts(b *testing.B) {
	allowed, err := filepath.EvalSymlinks(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	// An unprivileged owner: a rw mount of a root-owned directory is
	// refused.
	for _, d := range []string{"small", "many"} {
		if err := os.Mkdir(filepath.Join(allowed, d), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.Chown(filepath.Join(allowed, d), 1000, 1000); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(allowed, "small", "f"), []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		if err := os.WriteFile(filepath.Join(allowed, "many", strconv.Itoa(i)), []byte("x"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	// Written back before the first sample, so that the disk is idle.
	syscall.Sync()
	d := startDaemon(b, e2eStorage, "--allow-mount", allowed)
	if _, err := d.Client.CreateVolume(context.Background(), "bench", corral.VolumeOptions{}); err != nil {
		b.Fatal(err)
	}
	ways := []struct {
		name   string
		mounts []corral.Mount
	}{
		{"none-", nil},
		{"ro-", []corral.Mount{{Source: filepath.Join(allowed, "small"), Target: "/m", Mode: corral.MountReadOnly}}},
		{"rw-", []corral.Mount{{Source: filepath.Join(allowed, "small"), Target: "/m", Mode: corral.MountReadWrite}}},
		{"cow10k-", []corral.Mount{{Source: filepath.Join(allowed, "many"), Target: "/m", Mode: corral.MountCopyOnWrite}}},
		{"volume-", []corral.Mount{{Volume: "bench", Target: "/m", Mode: corral.MountReadWrite}}},
	}
	samples := make([][]time.Duration, len(ways))
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		for w, way := range ways {
			fo := &firstOutput{start: time.Now()}
			sb, _, err := d.Client.Run(ctx, corral.RunOptions{
				Sandbox: corral.CreateOptions{Template: "bb", Mounts: way.mounts},
				Exec:    corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: fo},
			})
			if err != nil {
				b.Fatal(err)
			}
			samples[w] = append(samples[w], fo.at)
			b.StopTimer()
			if err := d.Client.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	peer := reportPercentiles(b, ways[0].name, samples[0])
	for w, way := range ways[1:] {
		p := reportPercentiles(b, way.name, samples[w+1])
		b.ReportMetric(float64((p-peer).Microseconds())/1000, way.name+"added-p50-ms")
	}
}
