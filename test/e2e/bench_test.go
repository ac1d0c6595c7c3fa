package e2e

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/rootfs"
	corral "github.com/corralrun/corral/sdk"
)

// reportPercentiles adds p50 and p99 (in ms) of samples to b's metrics.
func reportPercentiles(b *testing.B, prefix string, samples []time.Duration) (p50 time.Duration) {
	if len(samples) == 0 {
		return 0
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(q float64) time.Duration { return samples[int(q*float64(len(samples)-1))] }
	b.ReportMetric(float64(at(0.5).Microseconds())/1000, prefix+"p50-ms")
	b.ReportMetric(float64(at(0.99).Microseconds())/1000, prefix+"p99-ms")
	return at(0.5)
}

// BenchmarkExecRoundTrip measures `exec true` on a running sandbox through
// the SDK, the daemon's unix socket and the in-sandbox agent: request to
// exit status.
//
//	go test -run '^$' -bench ExecRoundTrip -benchtime 2000x ./test/e2e
func BenchmarkExecRoundTrip(b *testing.B) {
	execRoundTrip(b, startDaemon(b, "btrfs"), "")
}

// execRoundTrip reports the p50 and p99 of `exec true` on one sandbox of
// runtime (the daemon's default when empty).
func execRoundTrip(b *testing.B, d *daemon, runtime string) {
	sb := d.create(b, corral.CreateOptions{Runtime: runtime})
	ctx := context.Background()
	opts := corral.ExecOptions{Cmd: []string{"/bin/true"}}
	for i := 0; i < 20; i++ { // warm connections and caches
		if _, err := d.Client.Exec(ctx, sb.ID, opts); err != nil {
			b.Fatal(err)
		}
	}
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		res, err := d.Client.Exec(ctx, sb.ID, opts)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, "", samples)
}

// firstOutput is an io.Writer that records when the first byte arrived.
type firstOutput struct {
	start time.Time
	at    time.Duration
}

func (f *firstOutput) Write(p []byte) (int, error) {
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return len(p), nil
}

// BenchmarkColdStart measures, in one run and alternating, (a) Corral's cold
// create of a sandbox until the first byte of `echo hi` arrives at the
// client, and (b) a bare `runc run` of the same busybox rootfs running
// `echo hi` until its first output byte. It reports both p50s and their
// ratio (target: corral/runc <= 1.3).
//
//	go test -run '^$' -bench ColdStart -benchtime 50x ./test/e2e
func BenchmarkColdStart(b *testing.B) {
	for _, storage := range storages() {
		b.Run(storage, func(b *testing.B) { benchColdStart(b, storage) })
	}
}

func benchColdStart(b *testing.B, storage string) {
	coldStart(b, startDaemon(b, storage), "", "runc-", bareRuncRun)
}

// coldStart alternates three ways to the first byte of `echo hi` in a new
// busybox sandbox on runtime (the daemon's default when empty), each
// followed by bare's run of the same rootfs: Corral's create and then exec
// (two calls), Corral's run (one call: create, exec), and bare. It reports
// the p50s (corral-, run-, and the peer's metrics prefixed with peer), the
// create call alone (create-), and the ratios of both Corral ways to bare.
func coldStart(b *testing.B, d *daemon, runtime, peer string, bare func(testing.TB, string) time.Duration) {
	bundle := bareBundle(b)
	ctx := context.Background()
	create := corral.CreateOptions{Template: "bb", Runtime: runtime}
	echo := func(w io.Writer) corral.ExecOptions {
		return corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: w}
	}
	var corralSamples, runSamples, peerSamples, createSamples []time.Duration
	for i := 0; i < b.N; i++ {
		// Two calls: create, then exec, timed to first output.
		fo := &firstOutput{start: time.Now()}
		sb, err := d.Client.Create(ctx, create)
		if err != nil {
			b.Fatal(err)
		}
		createAt := time.Since(fo.start)
		if _, err := d.Client.Exec(ctx, sb.ID, echo(fo)); err != nil {
			b.Fatal(err)
		}
		corralSamples = append(corralSamples, fo.at)
		createSamples = append(createSamples, createAt)
		b.StopTimer()
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		peerSamples = append(peerSamples, bare(b, bundle))
		b.StartTimer()

		// One call: run.
		fo = &firstOutput{start: time.Now()}
		sb, _, err = d.Client.Run(ctx, corral.RunOptions{Sandbox: create, Exec: echo(fo)})
		if err != nil {
			b.Fatal(err)
		}
		runSamples = append(runSamples, fo.at)
		b.StopTimer()
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		peerSamples = append(peerSamples, bare(b, bundle))
		b.StartTimer()
	}
	b.StopTimer()
	c := reportPercentiles(b, "corral-", corralSamples)
	run := reportPercentiles(b, "run-", runSamples)
	reportPercentiles(b, "create-", createSamples)
	r := reportPercentiles(b, peer, peerSamples)
	if r > 0 {
		b.ReportMetric(float64(c)/float64(r), "ratio-p50")
		b.ReportMetric(float64(run)/float64(r), "ratio-run-p50")
	}
}

// bareBundle makes an OCI bundle with a busybox rootfs whose process is
// `echo hi`, with runc's default spec (`runc spec`).
func bareBundle(b testing.TB) string {
	dir, err := os.MkdirTemp("", "corral-bare-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		os.RemoveAll(dir)
		os.RemoveAll(filepath.Join("/run/corral-test", filepath.Base(dir)))
	})
	if err := rootfs.FillBusybox(filepath.Join(dir, "rootfs"), ""); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("runc", "spec", "-b", dir).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v %s", err, out)
	}
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	proc := cfg["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"echo", "hi"}
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

// bareRuntimeRoot is the --root of the bare runtime runs of bundle: on the
// /run tmpfs, as runc's own default (/run/runc) and Corral's run dir are.
func bareRuntimeRoot(b testing.TB, bundle, name string) string {
	root := filepath.Join("/run/corral-test", filepath.Base(bundle), name)
	if err := os.MkdirAll(root, 0o700); err != nil {
		b.Fatal(err)
	}
	return root
}

// bareRuncRun runs the bundle with `runc run` and returns the time until
// its first output byte.
func bareRuncRun(b testing.TB, bundle string) time.Duration {
	id := "corral-bare-" + randHex(4)
	root := bareRuntimeRoot(b, bundle, "runc")
	cmd := exec.Command("runc", "--root", root, "run", "--bundle", bundle, id)
	return firstOutputOf(b, cmd, func() {
		_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
	})
}

// firstOutputOf runs cmd to its end, then cleanup, and returns the time
// from its start to its first output byte.
func firstOutputOf(b testing.TB, cmd *exec.Cmd, cleanup func()) time.Duration {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(stdout, buf); err != nil {
		b.Fatalf("reading %s output: %v", cmd.Path, err)
	}
	at := time.Since(start)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("%s: %v", cmd.Args, err)
	}
	cleanup()
	return at
}
