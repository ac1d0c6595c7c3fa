package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestAdmissionUnderLoad makes 200 concurrent creates against a capacity
// of 50. Every request either succeeds or gets a clean
// 503 with a retry hint, exactly the capacity is created, and after the
// sandboxes are deleted nothing is left.
func TestAdmissionUnderLoad(t *testing.T) {
	const capacity, tries = 50, 200
	d := startDaemon(t, "btrfs", "--max-sandboxes", strconv.Itoa(capacity),
		"--default-memory", "32M", "--default-cpus", "0.1", "--default-pids", "64")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	created, refused, wall := burst(t, ctx, d, tries)
	t.Logf("%d creates: %d created, %d refused in %v (2 cores, shared machine)", tries, len(created), refused, wall.Round(time.Millisecond))
	if len(created) != capacity || refused != tries-capacity {
		t.Fatalf("%d created and %d refused, want %d and %d", len(created), refused, capacity, tries-capacity)
	}

	list, err := d.Client.List(ctx, corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != capacity {
		t.Errorf("daemon lists %d sandboxes, want %d", len(list), capacity)
	}
	for _, sb := range list {
		if sb.State != "running" {
			t.Errorf("sandbox %s is %s", sb.ID, sb.State)
		}
	}
	if out, _ := d.execOut(t, created[len(created)-1], "echo ok"); out != "ok\n" {
		t.Errorf("exec in the last sandbox: %q", out)
	}
	scrapeStart := time.Now()
	s := scrape(t, d.Client)
	t.Logf("first /metrics scrape with %d sandboxes (usage read from runc): %v", capacity, time.Since(scrapeStart).Round(time.Microsecond))
	if n := len(s.Find("corral_sandbox_memory_bytes")); n != capacity {
		t.Errorf("memory samples of %d sandboxes, want %d", n, capacity)
	}
	wantMetrics(t, s, []metricCheck{
		{"corral_admission_refusals_total", []string{"reason", "max_sandboxes"}, tries - capacity},
		{"corral_admission_committed", []string{"resource", "sandboxes"}, capacity},
		{"corral_admission_committed", []string{"resource", "memory_bytes"}, capacity * 32 << 20},
		{"corral_sandboxes", []string{"state", "running", "runtime", "runc"}, capacity},
		{"corral_create_seconds_count", []string{"runtime", "runc"}, capacity},
	})

	deleteAndCheck(t, d, created)
	// The capacity is free again.
	d.create(t, corral.CreateOptions{})
	// The daemon's cleanup checks mounts, cgroups, loop devices, processes,
	// runc containers and networks.
}

// TestBurstWithDefaults sends 200 concurrent creates to a daemon with
// default settings. The daemon starts a few at a time and queues the rest, so every request either succeeds or gets a
// clean 503 busy with a retry hint, never a 500; each refusal is logged;
// after the sandboxes are deleted nothing is left.
func TestBurstWithDefaults(t *testing.T) {
	const tries = 200
	d := startDaemon(t, "btrfs")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	created, refused, wall := burst(t, ctx, d, tries)
	t.Logf("%d creates: %d created, %d refused in %v, %.1f creates/s (2 cores, shared machine)",
		tries, len(created), refused, wall.Round(time.Millisecond), float64(len(created))/wall.Seconds())
	if t.Failed() {
		t.FailNow()
	}
	if len(created) == 0 {
		t.Fatal("no create succeeded")
	}
	// The log arrives through a pipe, after the responses.
	if refused > 0 && !d.logged("sandbox create refused", refused) {
		t.Errorf("daemon logged %d refusals, want %d", strings.Count(d.Logs(), "sandbox create refused"), refused)
	}
	if n := strings.Count(d.Logs(), "sandbox create failed"); n != 0 {
		t.Errorf("daemon logged %d failed creates", n)
	}
	if out, _ := d.execOut(t, created[len(created)-1], "echo ok"); out != "ok\n" {
		t.Errorf("exec in the last sandbox: %q", out)
	}
	s := scrape(t, d.Client)
	var counted float64
	for _, reason := range []string{"start_queue_full", "start_wait_timeout"} {
		n, _ := s.Get("corral_admission_refusals_total", "reason", reason)
		counted += n
	}
	if counted != float64(refused) {
		t.Errorf("refusals for want of a starting slot: %v, want %d", counted, refused)
	}
	wantMetrics(t, s, []metricCheck{
		{"corral_admission_queue_length", nil, 0},
		{"corral_admission_starting", nil, 0},
		{"corral_create_seconds_count", []string{"runtime", "runc"}, float64(len(created))},
	})

	deleteAndCheck(t, d, created)
	// The daemon's cleanup checks mounts, cgroups, loop devices, processes,
	// runc containers and networks.
}

// burst sends n creates of the busybox template at once and returns the
// sandboxes made, the number refused with 503 busy and a retry hint, and
// how long they took together. Any other answer fails t.
func burst(t *testing.T, ctx context.Context, d *daemon, n int) (created []string, refused int, wall time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	gate := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-gate
			sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb"})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				created = append(created, sb.ID)
				return
			}
			var e *corral.Error
			if !errors.As(err, &e) || e.Status != 503 || e.Code != corral.CodeBusy || e.RetryAfter < time.Second {
				t.Errorf("create: %v (%#v), want success or 503 busy with Retry-After", err, e)
				return
			}
			refused++
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	return created, refused, time.Since(start)
}

// TestAdmissionPerKeyAndQueue: an API key over its limit gets 429 while
// the unix socket, its own principal, is unaffected; a create over host
// capacity waits in the queue until a sandbox goes; one that finds the
// queue full gets 503 at once.
func TestAdmissionPerKeyAndQueue(t *testing.T) {
	addr := testutil.FreeLoopbackAddr(t)
	d := startDaemon(t, "overlay", "--listen", addr, "--api-key", "secret",
		"--max-sandboxes", "4", "--max-per-key", "3", "--admission-queue", "1", "--admission-wait", "2m",
		"--default-memory", "32M")
	tcp, err := corral.New("http://"+addr, "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	ctx := t.Context()
	var keyed []string
	for range 3 {
		sb, err := tcp.Create(ctx, corral.CreateOptions{Template: "bb"})
		if err != nil {
			t.Fatal(err)
		}
		keyed = append(keyed, sb.ID)
	}
	_, err = tcp.Create(ctx, corral.CreateOptions{Template: "bb"})
	var e *corral.Error
	if !errors.As(err, &e) || e.Status != 429 || e.Code != corral.CodeResourceExhausted || e.RetryAfter != time.Second {
		t.Fatalf("fourth create with the key: %#v, want 429 resource_exhausted with Retry-After 1", err)
	}

	d.create(t, corral.CreateOptions{}) // the unix socket: 4 of 4
	queued := make(chan error, 1)
	go func() {
		_, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb"})
		queued <- err
	}()
	waitMetric(t, d.Client, "corral_admission_queue_length", nil, 1)
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb"}); corral.ErrorCode(err) != corral.CodeBusy {
		t.Fatalf("create with a full queue: %v, want busy", err)
	}
	select {
	case err := <-queued:
		t.Fatalf("queued create returned before capacity was free: %v", err)
	default:
	}
	if err := tcp.Delete(ctx, keyed[0]); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-queued:
		if err != nil {
			t.Fatalf("queued create: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("queued create not admitted after a delete")
	}
	wantMetrics(t, scrape(t, d.Client), []metricCheck{
		{"corral_admission_refusals_total", []string{"reason", "per_principal"}, 1},
		{"corral_admission_refusals_total", []string{"reason", "queue_full"}, 1},
		{"corral_admission_queue_length", nil, 0},
		{"corral_sandboxes", []string{"state", "running", "runtime", "runc"}, 4},
	})
}

// TestAdmissionCommitRatios: memory and CPU limits add up against the
// host's size times the ratios; a sandbox bigger than all of it is a 400.
func TestAdmissionCommitRatios(t *testing.T) {
	// Ratios that give 100 MiB of memory and one CPU on this host.
	memRatio := float64(100<<20) / float64(memTotal(t))
	cpuRatio := 1 / float64(runtime.NumCPU())
	d := startDaemon(t, "overlay", "--memory-commit-ratio", strconv.FormatFloat(memRatio, 'g', -1, 64),
		"--cpu-commit-ratio", strconv.FormatFloat(cpuRatio, 'g', -1, 64))
	ctx := t.Context()
	half := d.create(t, corral.CreateOptions{MemoryMB: 16, CPUs: 0.5})
	d.create(t, corral.CreateOptions{MemoryMB: 16, CPUs: 0.5})
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 16, CPUs: 0.5}); corral.ErrorCode(err) != corral.CodeBusy {
		t.Fatalf("create over the CPU commit: %v, want busy", err)
	}
	if err := d.Client.Delete(ctx, half.ID); err != nil {
		t.Fatal(err)
	}
	d.create(t, corral.CreateOptions{MemoryMB: 64, CPUs: 0.1}) // 80 MiB of 100
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 32, CPUs: 0.1}); corral.ErrorCode(err) != corral.CodeBusy {
		t.Fatalf("create over the memory commit: %v, want busy", err)
	}
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 200}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("create bigger than the host's capacity: %v, want invalid_argument", err)
	}
	wantMetrics(t, scrape(t, d.Client), []metricCheck{
		{"corral_admission_refusals_total", []string{"reason", "cpu"}, 1},
		{"corral_admission_refusals_total", []string{"reason", "memory"}, 1},
		{"corral_admission_committed", []string{"resource", "millicpus"}, 600},
		{"corral_admission_committed", []string{"resource", "memory_bytes"}, 80 << 20},
	})
}

type metricCheck struct {
	name   string
	labels []string
	want   float64
}

func scrape(t *testing.T, c *corral.Client) *metrics.Scrape {
	t.Helper()
	text, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	s, err := metrics.Parse(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, text)
	}
	return s
}

func wantMetrics(t *testing.T, s *metrics.Scrape, checks []metricCheck) {
	t.Helper()
	for _, c := range checks {
		if got, ok := s.Get(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

func waitMetric(t *testing.T, c *corral.Client, name string, labels []string, want float64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got, _ := scrape(t, c).Get(name, labels...); got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v did not reach %v", name, labels, want)
		}
	}
}

// deleteAndCheck deletes the sandboxes ids, the daemon's only ones, and
// checks that they left no driver directory, storage root or admission
// claim; the daemon's cleanup checks the host.
func deleteAndCheck(t *testing.T, d *daemon, ids []string) {
	t.Helper()
	deleteAll(t, d, ids)
	if n := dirEntries(t, filepath.Join(d.RunDir, "runc", "sandboxes")); n != 0 {
		t.Errorf("%d driver dirs left after deleting every sandbox", n)
	}
	if n := dirEntries(t, rootsDir(d)); n != 0 {
		t.Errorf("%d storage roots left after deleting every sandbox", n)
	}
	wantMetrics(t, scrape(t, d.Client), []metricCheck{
		{"corral_admission_committed", []string{"resource", "sandboxes"}, 0},
		{"corral_admission_committed", []string{"resource", "memory_bytes"}, 0},
	})
}

// deleteAll deletes sandboxes a few at a time.
func deleteAll(t *testing.T, d *daemon, ids []string) {
	t.Helper()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := d.Client.Delete(context.Background(), id); err != nil {
				t.Errorf("deleting %s: %v", id, err)
			}
		})
	}
	wg.Wait()
}

func dirEntries(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return len(entries)
}

func memTotal(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
