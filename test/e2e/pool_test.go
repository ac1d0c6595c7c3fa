package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/network/nettest"
	corral "github.com/corralrun/corral/sdk"
)

// waitPoolFull waits until pool name has all its sandboxes ready and none
// being made.
func (d *daemon) waitPoolFull(t testing.TB, name string) *corral.Pool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := d.Client.GetPool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready == p.Size && p.Filling == 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s not full after a minute: %+v\nlogs:\n%s", name, p, d.Logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// removePoolAtCleanup deletes pool name before the daemon's own cleanup,
// which checks that nothing leaked.
func (d *daemon) removePoolAtCleanup(t testing.TB, name string) {
	t.Cleanup(func() {
		if !d.Running() {
			return
		}
		if err := d.Client.DeletePool(context.Background(), name); err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
			t.Errorf("deleting pool %s: %v", name, err)
		}
	})
}

// TestWarmPool defines a pool with the CLI, claims a sandbox from it with
// a create of its shape (per-claim env, metadata and deadline), checks that
// pooled sandboxes stay hidden, and that the pool survives a daemon crash:
// its sandboxes are adopted after a ping and still claimable.
func TestWarmPool(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	ctx := t.Context()
	d.removePoolAtCleanup(t, "warm")
	out, errOut, code := d.corral("pool", "set", "warm", "--template", "bb", "--memory", "128M", "--size", "2")
	if code != 0 || !strings.Contains(out, "warm") {
		t.Fatalf("corral pool set: %d %q %q", code, out, errOut)
	}
	d.waitPoolFull(t, "warm")
	if list, err := d.Client.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("pooled sandboxes are listed: %v %+v", err, list)
	}
	out, _, _ = d.corral("pool", "ls")
	if !strings.Contains(out, "warm") || !strings.Contains(out, "bb") {
		t.Fatalf("corral pool ls: %q", out)
	}

	before := time.Now()
	sb := d.create(t, corral.CreateOptions{Template: "bb", MemoryMB: 128, Timeout: corral.Timeout(time.Minute),
		Env: map[string]string{"GREETING": "warm hello"}, Metadata: map[string]string{"who": "e2e"}})
	if !d.logged(`sandbox claimed from pool" sandbox_id=`+sb.ID, 1) {
		t.Fatalf("create of the pool's shape did not claim\nlogs:\n%s", d.Logs())
	}
	if got, _ := d.execOut(t, sb.ID, "echo $GREETING"); got != "warm hello\n" {
		t.Fatalf("claimed env: %q", got)
	}
	if sb.Metadata["who"] != "e2e" || sb.Deadline == nil || sb.Deadline.Before(before.Add(50*time.Second)) || sb.Deadline.After(time.Now().Add(61*time.Second)) {
		t.Fatalf("claimed sandbox %+v", sb)
	}
	if list, _ := d.Client.List(ctx, corral.ListOptions{}); len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list after claim: %+v", list)
	}
	// Another shape is a cold create.
	cold := d.create(t, corral.CreateOptions{Template: "bb", MemoryMB: 64})
	if strings.Contains(d.Logs(), "sandbox_id="+cold.ID+" pool=") {
		t.Fatal("a create of another shape claimed from the pool")
	}
	d.waitPoolFull(t, "warm")

	d.Kill()
	d.Start()
	p := d.waitPoolFull(t, "warm")
	if p.Ready != 2 || !d.logged("adopted warm pool member", 1) {
		t.Fatalf("pool after a crash: %+v\nlogs:\n%s", p, d.Logs())
	}
	again := d.create(t, corral.CreateOptions{Pool: "warm"})
	if got, _ := d.execOut(t, again.ID, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"); got != "134217728\n" {
		t.Fatalf("memory limit of a sandbox claimed after the crash: %q", got)
	}
	if _, errOut, code := d.corral("pool", "rm", "warm"); code != 0 {
		t.Fatalf("corral pool rm: %d %q", code, errOut)
	}
	if out, _, _ := d.corral("pool", "ls"); strings.Contains(out, "warm") {
		t.Fatalf("pool left after rm: %q", out)
	}
	// Claimed sandboxes outlive their pool.
	if got, _ := d.execOut(t, again.ID, "echo still here"); got != "still here\n" {
		t.Fatalf("claimed sandbox after pool rm: %q", got)
	}
}

// TestIdleTimeoutDestroys creates sandboxes with a 2 s idle timeout: one
// kept busy by execs outlives it, one left alone is destroyed, and reading
// a sandbox's record does not count as activity.
func TestIdleTimeoutDestroys(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	ctx := t.Context()
	out, errOut, code := d.corral("create", "--template", "bb", "--idle-timeout", "2s")
	if code != 0 {
		t.Fatalf("corral create --idle-timeout: %d %q", code, errOut)
	}
	idle := strings.TrimSpace(out)
	busy := d.create(t, corral.CreateOptions{IdleTimeout: 2 * time.Second})
	if busy.IdleTimeout != 2 || busy.OnIdle != corral.ActionDestroy {
		t.Fatalf("created %+v", busy)
	}
	kept := d.create(t, corral.CreateOptions{IdleTimeout: 2 * time.Second})
	if out, errOut, code := d.corral("update", kept.ID, "--idle-timeout", "0"); code != 0 || !strings.Contains(out, "idle timeout 0s") {
		t.Fatalf("corral update --idle-timeout 0: %d %q %q", code, out, errOut)
	}
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		d.execOut(t, busy.ID, "true")
		if _, err := d.Client.Get(ctx, idle); err != nil && time.Now().Before(end.Add(-3500*time.Millisecond)) {
			t.Fatalf("idle sandbox gone before its idle timeout: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := d.Client.Get(ctx, idle); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("idle sandbox not destroyed after 5 s: %v", err)
	}
	for _, id := range []string{busy.ID, kept.ID} {
		if _, err := d.Client.Get(ctx, id); err != nil {
			t.Fatalf("sandbox %s destroyed: %v", id, err)
		}
	}
	if !strings.Contains(d.Logs(), `sandbox timer fired" sandbox_id=`+idle+" timer=idle action=destroy") {
		t.Fatalf("no idle timer log\nlogs:\n%s", d.Logs())
	}
	// on_idle pause freezes the idle sandbox instead; resuming it brings it
	// back with its files and processes.
	paused := d.create(t, corral.CreateOptions{IdleTimeout: 2 * time.Second, OnIdle: corral.ActionPause})
	d.execOut(t, paused.ID, "echo kept > /tmp/f")
	for end := time.Now().Add(6 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		sb, err := d.Client.Get(ctx, paused.ID)
		if err != nil {
			t.Fatalf("sandbox with on_idle pause: %v", err)
		}
		if sb.State == "paused" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("sandbox not paused 6 s after an idle timeout of 2 s: %s", sb.State)
		}
	}
	if _, err := d.Client.Resume(ctx, paused.ID, corral.Timeout(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.execOut(t, paused.ID, "cat /tmp/f"); got != "kept\n" {
		t.Fatalf("file after idle pause and resume: %q", got)
	}
}

// BenchmarkWarmClaim measures a claim from a warm pool (Create of the
// pool's shape) plus `echo hi` to the first stdout byte, on runc. Before
// each claim the pool is full and idle, so every sample is a claim.
//
//	go test -run '^$' -bench WarmClaim -benchtime 200x ./test/e2e
func BenchmarkWarmClaim(b *testing.B) {
	warmClaim(b, startDaemon(b, e2eStorage), "runc")
}

// BenchmarkWarmClaimGVisor is BenchmarkWarmClaim on gVisor.
func BenchmarkWarmClaimGVisor(b *testing.B) {
	warmClaim(b, startGVisorDaemon(b), "gvisor")
}

func warmClaim(b *testing.B, d *daemon, runtime string) {
	ctx := context.Background()
	if _, err := d.Client.SetPool(ctx, "bench", corral.PoolOptions{Template: "bb", Runtime: runtime, Size: 2}); err != nil {
		b.Fatal(err)
	}
	d.removePoolAtCleanup(b, "bench")
	var total, claim []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		d.waitPoolFull(b, "bench")
		b.StartTimer()
		fb := &firstOutput{start: time.Now()}
		sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Runtime: runtime})
		if err != nil {
			b.Fatal(err)
		}
		claimed := time.Since(fb.start)
		if _, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: fb}); err != nil || fb.at == 0 {
			b.Fatalf("exec: %v (first output after %s)", err, fb.at)
		}
		b.StopTimer()
		total = append(total, fb.at)
		claim = append(claim, claimed)
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	if !d.logged("sandbox claimed from pool", b.N) {
		n := strings.Count(d.Logs(), "sandbox claimed from pool")
		b.Fatalf("%d of %d creates claimed from the pool", n, b.N)
	}
	reportPercentiles(b, "claim-", claim)
	reportPercentiles(b, "", total)
}

// TestWarmPoolNetwork claims from a pool whose sandboxes wait with an
// allowlist that allows nothing: the claim's policy is applied live on the
// host, so the claimed sandbox reaches example.test and nothing else.
func TestWarmPoolNetwork(t *testing.T) {
	w := newNetWorld(t, e2eStorage, "runc")
	d := w.d
	d.removePoolAtCleanup(t, "net")
	if _, err := d.Client.SetPool(t.Context(), "net", corral.PoolOptions{Template: "bb", Network: "allowlist", Size: 1}); err != nil {
		t.Fatal(err)
	}
	d.waitPoolFull(t, "net")
	sb := d.create(t, corral.CreateOptions{Pool: "net", Network: &corral.NetworkPolicy{AllowDomains: []string{"example.test"}}})
	if !d.logged(`sandbox claimed from pool" sandbox_id=`+sb.ID, 1) {
		t.Fatalf("create did not claim\nlogs:\n%s", d.Logs())
	}
	if sb.Network == nil || sb.Network.Mode != "allowlist" || len(sb.Network.AllowDomains) != 1 {
		t.Fatalf("claimed sandbox's policy: %+v", sb.Network)
	}
	if out, code := w.sh(t, sb.ID, "wget -qO- http://example.test/"); code != 0 || nettest.Field(out, "server") != "a" {
		t.Fatalf("allowed domain from a claimed sandbox: %d %q", code, out)
	}
	if out, code := w.sh(t, sb.ID, "wget -T 3 -qO- http://other.test/"); code == 0 {
		t.Fatalf("other.test reachable from a claimed sandbox: %q", out)
	}
}

// TestWarmPoolGVisor claims from a gVisor pool and checks that the pool's
// sandboxes survive a daemon crash: their agents dial the restarted daemon
// and answer the adoption ping.
func TestWarmPoolGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	d.removePoolAtCleanup(t, "gv")
	if _, errOut, code := d.corral("pool", "set", "gv", "--template", "bb", "--runtime", "gvisor", "--size", "1"); code != 0 {
		t.Fatalf("corral pool set: %d %q", code, errOut)
	}
	d.waitPoolFull(t, "gv")
	d.Kill()
	d.Start()
	d.waitPoolFull(t, "gv")
	// The member is ready in the pool a moment before its adoption is logged.
	if !d.logged("adopted warm pool member", 1) {
		t.Fatalf("gVisor pool member not adopted after a crash\nlogs:\n%s", d.Logs())
	}
	sb := d.create(t, corral.CreateOptions{Template: "bb", Runtime: "gvisor", Env: map[string]string{"K": "v"}})
	if !d.logged(`sandbox claimed from pool" sandbox_id=`+sb.ID, 1) {
		t.Fatalf("create did not claim\nlogs:\n%s", d.Logs())
	}
	if got, _ := d.execOut(t, sb.ID, "echo $K; uname -r"); !strings.HasPrefix(got, "v\n") || !strings.Contains(got, "gvisor") {
		t.Fatalf("exec in claimed gVisor sandbox: %q", got)
	}
}

// TestPoolFlag defines a pool with `corral server --pool`: on the first
// start its template does not exist yet, which is logged and skipped; after
// a restart the pool is there and fills.
func TestPoolFlag(t *testing.T) {
	d := startDaemon(t, e2eStorage, "--pool", "name=boot,template=bb,size=1,memory=64M")
	d.removePoolAtCleanup(t, "boot")
	if !strings.Contains(d.Logs(), "defining pool from the configuration") {
		t.Fatalf("no log of the skipped pool\nlogs:\n%s", d.Logs())
	}
	if _, err := d.Client.GetPool(t.Context(), "boot"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("pool defined without its template: %v", err)
	}
	d.Stop()
	d.Start()
	p := d.waitPoolFull(t, "boot")
	if p.Template != "bb" || p.MemoryMB != 64 || p.Size != 1 {
		t.Fatalf("pool from the flag: %+v", p)
	}
}
