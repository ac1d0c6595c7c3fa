package vm

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/testutil"
)

// BenchmarkColdStart measures, alternating in one run, a bare QEMU boot
// of the driver's kernel and initramfs to the agent's first output (its
// usage message, for a flag it does not know) and a Create followed by
// the first exec's output, with the ratio of their medians.
//
//	go test -run '^$' -bench ColdStart -benchtime 10x ./internal/driver/vm
func BenchmarkColdStart(b *testing.B) {
	e := newEnv(b)
	d := e.newDriver(b, nil)
	ctx := context.Background()
	r := driver.Resources{MemoryBytes: 256 << 20, MilliCPUs: 1000}
	var bare, create, exec1 []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		root := testutil.BusyboxRootfs(b)
		b.StartTimer()
		t0 := time.Now()
		if err := bareBoot(ctx, d, r); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(t0))
		id := fmt.Sprintf("cold-%d", i)
		t1 := time.Now()
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: root, Resources: r}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if out, err := drivertest.ExecOnce(ctx, d, id, "echo hi"); err != nil || out != "hi\n" {
			b.Fatalf("first exec: %q, %v", out, err)
		}
		create = append(create, t2.Sub(t1))
		exec1 = append(exec1, time.Since(t1))
		b.StopTimer()
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(ms(median(bare)), "bare-boot-ms")
	b.ReportMetric(ms(median(create)), "create-ms")
	b.ReportMetric(ms(median(exec1)), "create-to-output-ms")
	b.ReportMetric(float64(median(exec1))/float64(median(bare)), "ratio-p50")
}

// BenchmarkExecRoundTrip measures an exec of `true` in a running VM, from
// the request to the exit event, through a new agent client each time.
//
//	go test -run '^$' -bench ExecRoundTrip -benchtime 100x ./internal/driver/vm
func BenchmarkExecRoundTrip(b *testing.B) {
	e := newEnv(b)
	d := e.newDriver(b, nil)
	ctx := context.Background()
	if err := d.Create(ctx, driver.Spec{ID: "exec", RootFS: testutil.BusyboxRootfs(b)}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Delete(context.Background(), "exec") })
	var times []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := drivertest.ExecOnce(ctx, d, "exec", "true"); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	b.ReportMetric(ms(times[len(times)/2]), "p50-ms")
	b.ReportMetric(ms(times[len(times)*99/100]), "p99-ms")
}

// bareBoot boots d's kernel and initramfs in a QEMU of the same machine
// and size as a sandbox's, without disks, until the agent writes its
// usage message to the serial console.
func bareBoot(ctx context.Context, d *Driver, r driver.Resources) error {
	_, mem := d.memory(r)
	accel, cpu := "kvm", "host"
	if d.accel != "kvm" {
		accel, cpu = "tcg,tb-size=64", "max"
	}
	kernel := "console=ttyS0 quiet panic=-1 reboot=t"
	if d.tscKHz > 0 {
		kernel += " tsc_early_khz=" + strconv.FormatInt(d.tscKHz, 10)
	}
	cmd := exec.CommandContext(ctx, d.qemu, "-machine", "microvm,pit=on,pic=on,rtc=on", "-accel", accel, "-cpu", cpu,
		"-m", strconv.FormatInt(mem>>20, 10)+"M", "-smp", strconv.Itoa(cpus(r, d.hostCPUs)),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
		"-kernel", d.kernel.Image, "-initrd", d.initrd,
		"-append", kernel+" rdinit=/agent -- agent --no-such-flag")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "flag provided but not defined") {
			return nil
		}
	}
	return fmt.Errorf("bare boot ended without the agent's output: %v", sc.Err())
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
