package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkPauseResume measures pause and resume of a runc sandbox
// through the SDK and the daemon (the freezer cgroup), each reported on
// its own.
//
//	go test -run '^$' -bench PauseResume -benchtime 200x ./test/e2e
func BenchmarkPauseResume(b *testing.B) {
	d := startDaemon(b, e2eStorage)
	sb := d.create(b, corral.CreateOptions{})
	d.execOut(b, sb.ID, "sleep 3600 & sleep 3600 & true")
	ctx := context.Background()
	var pause, resume []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := d.Client.Pause(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := d.Client.Resume(ctx, sb.ID, nil); err != nil {
			b.Fatal(err)
		}
		pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	reportPercentiles(b, "pause-", pause)
	reportPercentiles(b, "resume-", resume)
}

// BenchmarkSnapshotFilesystem measures a named filesystem snapshot of a
// runc sandbox that changed changedMiB of files (freeze, archive, thaw,
// checksum, sync, rename, record) and a create from it until it runs.
//
//	go test -run '^$' -bench SnapshotFilesystem -benchtime 20x ./test/e2e
func BenchmarkSnapshotFilesystem(b *testing.B) {
	for _, mib := range []int{1, 64} {
		b.Run(fmt.Sprintf("changed=%dMiB", mib), func(b *testing.B) {
			d := startDaemon(b, e2eStorage)
			sb := d.create(b, corral.CreateOptions{Timeout: corral.Timeout(time.Hour)})
			d.execOut(b, sb.ID, fmt.Sprintf("mkdir /work; dd if=/dev/urandom of=/work/blob bs=1M count=%d 2>/dev/null", mib))
			ctx := context.Background()
			var snap, restore []time.Duration
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("s%d", i)
				t0 := time.Now()
				if _, err := d.Client.CreateSnapshot(ctx, sb.ID, name, nil); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				c, err := d.Client.Create(ctx, corral.CreateOptions{FromSnapshot: name})
				if err != nil {
					b.Fatal(err)
				}
				snap, restore = append(snap, t1.Sub(t0)), append(restore, time.Since(t1))
				b.StopTimer()
				if err := d.Client.Delete(ctx, c.ID); err != nil {
					b.Fatal(err)
				}
				if err := d.Client.DeleteSnapshot(ctx, name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			reportPercentiles(b, "snapshot-", snap)
			reportPercentiles(b, "create-from-", restore)
		})
	}
}

// BenchmarkForkGVisor measures a fork of a running gVisor sandbox holding
// 100 MiB of live memory (random bytes in its tmpfs, so no page is zero)
// into 1 and 4 copies, until the API answers with all copies running
// (their agents connected), and then the first exec in the last copy.
//
//	go test -run '^$' -bench ForkGVisor -benchtime 10x ./test/e2e
func BenchmarkForkGVisor(b *testing.B) {
	d := startGVisorDaemon(b)
	sb := d.create(b, corral.CreateOptions{Runtime: "gvisor", MemoryMB: 512, Pids: 256, Timeout: corral.Timeout(time.Hour)})
	d.execOut(b, sb.ID, "dd if=/dev/urandom of=/tmp/blob bs=1M count=100 2>/dev/null; sleep 3600 >/dev/null 2>&1 &")
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("copies=%d", n), func(b *testing.B) { benchFork(b, d, sb.ID, n) })
	}
}

func benchFork(b *testing.B, d *daemon, id string, n int) {
	ctx := context.Background()
	var fork, first []time.Duration
	for b.Loop() {
		t0 := time.Now()
		copies, err := d.Client.Fork(ctx, id, n)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if out, _ := d.execOut(b, copies[n-1].ID, "test -s /tmp/blob && echo ok"); out != "ok\n" {
			b.Fatalf("copy holds %q", out)
		}
		fork, first = append(fork, t1.Sub(t0)), append(first, time.Since(t1))
		b.StopTimer()
		var wg sync.WaitGroup
		for _, c := range copies {
			wg.Go(func() {
				if err := d.Client.Delete(ctx, c.ID); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		b.StartTimer()
	}
	reportPercentiles(b, "fork-", fork)
	reportPercentiles(b, "first-exec-", first)
}
