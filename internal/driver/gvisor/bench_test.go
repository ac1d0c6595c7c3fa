package gvisor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
)

// BenchmarkFork measures a fork of a running sandbox that holds memory: Checkpoint leaving it running (including the
// agent's reconnection), then Restore of a copy into its own root (copied
// beforehand, outside the timing: storage makes that copy with a snapshot)
// until the copy's agent answers an exec.
//
//	go test -run '^$' -bench Fork -benchtime 10x ./internal/driver/gvisor
func BenchmarkFork(b *testing.B) {
	for _, mib := range []int{16, 128} {
		b.Run(fmt.Sprintf("mem=%dMiB", mib), func(b *testing.B) { benchFork(b, mib) })
	}
}

func benchFork(b *testing.B, mib int) {
	e := newEnv(b)
	d := e.newDriver(b, nil)
	ctx := context.Background()
	root := e.shiftedRootfs(b)
	r := driver.Resources{MemoryBytes: 512 << 20, Pids: 256}
	if err := d.Create(ctx, driver.Spec{ID: "orig", RootFS: root, Resources: r}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Delete(context.Background(), "orig") })
	// mib MiB of memory: a file of random bytes in /tmp, gVisor's tmpfs
	// (random, so that the image cannot skip zero pages), and a process.
	fill := fmt.Sprintf("dd if=/dev/urandom of=/tmp/blob bs=1M count=%d 2>/dev/null; echo ready > /tmp/ready; sleep 3600 &", mib)
	if _, err := drivertest.ExecOnce(ctx, d, "orig", fill); err != nil {
		b.Fatal(err)
	}
	var ckpt, restore, first time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		image := b.TempDir()
		croot := copyTree(b, root)
		id := fmt.Sprintf("copy-%d", i)
		b.StartTimer()
		t0 := time.Now()
		if err := d.Checkpoint(ctx, "orig", image, true); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := d.Restore(ctx, id, driver.Spec{RootFS: croot, Resources: r}, image); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if out, err := drivertest.ExecOnce(ctx, d, id, "cat /tmp/ready"); err != nil || out != "ready\n" {
			b.Fatalf("exec in the copy: %q, %v", out, err)
		}
		t3 := time.Now()
		b.StopTimer()
		ckpt += t1.Sub(t0)
		restore += t2.Sub(t1)
		first += t3.Sub(t2)
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(ckpt.Microseconds())/1000/n, "checkpoint-ms/op")
	b.ReportMetric(float64(restore.Microseconds())/1000/n, "restore-ms/op")
	b.ReportMetric(float64((ckpt+restore+first).Microseconds())/1000/n, "fork-to-exec-ms/op")
}
