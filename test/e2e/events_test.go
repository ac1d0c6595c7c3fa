package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestEventsAndMetrics follows /v1/events through the SDK and `corral
// events` while a sandbox is created, used and deleted, and scrapes
// /metrics (behind the API key on TCP) for what that did.
func TestEventsAndMetrics(t *testing.T) {
	addr := testutil.FreeLoopbackAddr(t)
	d := startDaemon(t, "overlay", "--listen", addr, "--api-key", "secret")
	ctx := t.Context()

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("/metrics without the key: %d, want 401", resp.StatusCode)
	}
	tcp, err := corral.New("http://"+addr, "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()

	stream, err := tcp.Events(ctx, corral.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	cli := exec.Command(d.Bin, "events", "--json")
	cli.Env = append(os.Environ(), "CORRAL_HOST=unix://"+d.Socket)
	cliOut, err := cli.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cli.ProcessState == nil {
			_ = cli.Process.Kill()
			_ = cli.Wait()
		}
	}()
	waitMetric(t, d.Client, "corral_event_subscribers", nil, 2)

	sb := d.create(t, corral.CreateOptions{})
	for range 3 {
		d.execOut(t, sb.ID, "echo hi")
	}
	s := scrape(t, tcp)
	wantMetrics(t, s, []metricCheck{
		{"corral_sandboxes", []string{"state", "running", "runtime", "runc"}, 1},
		{"corral_create_seconds_count", []string{"runtime", "runc"}, 1},
		{"corral_exec_start_seconds_count", []string{"runtime", "runc"}, 3},
		{"corral_exec_start_seconds_bucket", []string{"runtime", "runc", "le", "+Inf"}, 3},
		{"corral_pool_hits_total", nil, 0},
		{"corral_pool_misses_total", nil, 0},
		{"corral_pool_misses_total", nil, 0},
	})
	if v, ok := s.Get("corral_sandbox_memory_bytes", "sandbox_id", sb.ID, "runtime", "runc"); !ok || v <= 0 {
		t.Errorf("memory of %s = %v (present %v), want > 0", sb.ID, v, ok)
	}
	if v, ok := s.Get("corral_sandbox_cpu_seconds_total", "sandbox_id", sb.ID, "runtime", "runc"); !ok || v <= 0 {
		t.Errorf("CPU time of %s = %v (present %v), want > 0", sb.ID, v, ok)
	}
	if s.Types["corral_sandbox_cpu_seconds_total"] != "counter" || s.Types["corral_create_seconds"] != "histogram" {
		t.Errorf("types: %v", s.Types)
	}

	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{"created creating", "running running", "deleted deleting"}
	var got []string
	for range want {
		ev, err := stream.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.SandboxID != sb.ID || ev.Runtime != "runc" || ev.Template != "bb" || ev.Time.IsZero() {
			t.Errorf("event %+v", ev)
		}
		got = append(got, ev.Type+" "+ev.State)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SDK events (-want +got):\n%s", diff)
	}

	// The CLI printed the same events, one JSON object a line; SIGINT
	// (to the process this test started) ends it with status 0.
	sc := bufio.NewScanner(cliOut)
	got = nil
	for len(got) < len(want) && sc.Scan() {
		var ev corral.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("corral events printed %q: %v", sc.Text(), err)
		}
		got = append(got, ev.Type+" "+ev.State)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("corral events (-want +got):\n%s", diff)
	}
	_ = cli.Process.Signal(syscall.SIGINT)
	_, _ = io.Copy(io.Discard, cliOut)
	if err := cli.Wait(); err != nil {
		t.Errorf("corral events after SIGINT: %v", err)
	}

	// A sandbox whose deadline passes: timeout, then deleted, on a stream
	// filtered to those types.
	only, err := d.Client.Events(ctx, corral.EventOptions{Types: []string{corral.EventTimeout, corral.EventDeleted}})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	short := d.create(t, corral.CreateOptions{Timeout: corral.Timeout(time.Second)})
	got = nil
	for len(got) < 2 {
		ev, err := only.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.SandboxID != short.ID {
			t.Fatalf("event of another sandbox: %+v", ev)
		}
		got = append(got, ev.Type)
	}
	if diff := cmp.Diff([]string{"timeout", "deleted"}, got); diff != "" {
		t.Errorf("events of an expiring sandbox (-want +got):\n%s", diff)
	}

	// Stopping the daemon ends open streams cleanly instead of waiting for
	// them.
	end, err := tcp.Events(ctx, corral.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer end.Close()
	d.Stop()
	if _, err := end.Next(); err != io.EOF {
		t.Errorf("stream after the daemon stopped: %v, want io.EOF", err)
	}
}
