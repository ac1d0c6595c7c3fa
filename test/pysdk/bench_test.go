package pysdk

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkExecRoundTrip measures one exec of `true` on a running runc
// sandbox through the Go SDK and through the Python SDK, interleaved in
// rounds on the same sandbox and daemon so that both see the same load,
// and reports each one's p50 and the difference (the Python SDK's target:
// at most 1 ms more). b.N counts rounds of 20 samples of each.
func BenchmarkExecRoundTrip(b *testing.B) {
	requirePython(b)
	d, env := startDaemon(b, "runc")
	ctx := context.Background()
	sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Client.Delete(ctx, sb.ID)

	script, err := filepath.Abs(filepath.Join("testdata", "exec_bench.py"))
	if err != nil {
		b.Fatal(err)
	}
	sdk, err := filepath.Abs(sdkDir)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(python, script, "unix://"+d.Socket, sb.ID)
	cmd.Env = append(append(os.Environ(), env...), "PYTHONPATH="+sdk)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	python := func(n int) []time.Duration {
		fmt.Fprintln(stdin, n)
		if !lines.Scan() {
			b.Fatalf("the Python benchmark script ended: %v", lines.Err())
		}
		var ns []int64
		if err := json.Unmarshal(lines.Bytes(), &ns); err != nil {
			b.Fatal(err)
		}
		out := make([]time.Duration, len(ns))
		for i, v := range ns {
			out[i] = time.Duration(v)
		}
		return out
	}
	golang := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			start := time.Now()
			res, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"true"}})
			out[i] = time.Since(start)
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("exec true: %v %+v", err, res)
			}
		}
		return out
	}
	// Warm both clients' connections and the sandbox.
	golang(20)
	python(20)

	const perRound = 20
	var goSamples, pySamples []time.Duration
	b.ResetTimer()
	for range b.N {
		goSamples = append(goSamples, golang(perRound)...)
		pySamples = append(pySamples, python(perRound)...)
	}
	b.StopTimer()
	goP50, pyP50 := p50(goSamples), p50(pySamples)
	b.ReportMetric(float64(goP50.Microseconds())/1000, "go-p50-ms")
	b.ReportMetric(float64(pyP50.Microseconds())/1000, "py-p50-ms")
	b.ReportMetric(float64((pyP50-goP50).Microseconds())/1000, "py-minus-go-ms")
	b.ReportMetric(0, "ns/op")
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
