package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// startGVisorDaemon starts a daemon that offers gVisor (found by its
// doctor check), or skips without runsc.
func startGVisorDaemon(t testing.TB) *daemon {
	t.Helper()
	testutil.RequiresBinary(t, "runsc")
	return startDaemon(t, e2eStorage, "--runtimes", "gvisor")
}

// TestGVisor runs the user-facing paths on the gvisor runtime: the kernel
// a command sees, the advertised capabilities, exec, files, and a
// background process, then a daemon crash: the sandbox's agent connects
// to the restarted daemon and the process is re-attached.
func TestGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	ctx := t.Context()

	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.corral("run", "--runtime", "gvisor", "--template", "bb", "--", "uname", "-r")
	if code != 0 || !strings.Contains(out, "gvisor") || out == string(host) {
		t.Fatalf("corral run --runtime gvisor -- uname -r: %d %q %q (host: %q)", code, out, errOut, host)
	}
	t.Logf("kernel inside gVisor: %s", strings.TrimSpace(out))

	v, err := d.Client.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, rt := range v.Runtimes {
		if rt.Name == "gvisor" {
			found = true
			if !rt.Capabilities.Checkpoint || !rt.Capabilities.Pause || rt.Capabilities.Isolation != "gvisor" || rt.Default {
				t.Errorf("gvisor runtime advertised as %+v", rt)
			}
		}
	}
	if !found {
		t.Fatalf("runtimes %+v lack gvisor", v.Runtimes)
	}

	sb := d.create(t, corral.CreateOptions{Runtime: "gvisor", MemoryMB: 256, Pids: 128})
	if sb.Runtime != "gvisor" {
		t.Fatalf("created sandbox runs on %q", sb.Runtime)
	}
	if out, res := d.execOut(t, sb.ID, "echo $((6*7)); exit 3"); out != "42\n" || res.ExitCode != 3 {
		t.Fatalf("exec: %q %+v", out, res)
	}
	payload := bytes.Repeat([]byte("gvisor\x00"), 50000)
	if _, err := d.Client.WriteFile(ctx, sb.ID, "/work/data.bin", bytes.NewReader(payload), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _ := d.execOut(t, sb.ID, "wc -c < /work/data.bin"); strings.TrimSpace(out) != strconv.Itoa(len(payload)) {
		t.Fatalf("size seen inside: %q", out)
	}
	out, errOut, code = d.corral("exec", "-d", "--tag", "clock", sb.ID, "--", "sh", "-c", "while true; do date +%s.%N; sleep 0.2; done")
	if code != 0 {
		t.Fatalf("exec -d: %d %s", code, errOut)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("exec -d printed %q", out)
	}
	// Output from before the kill: two stamps, in an earlier second.
	for deadline := time.Now().Add(10 * time.Second); ; {
		before, _, _ := d.corral("logs", sb.ID, strconv.Itoa(pid))
		if s := stamps(before); len(s) >= 2 && s[0] < time.Now().Unix() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output from the background process: %q", before)
		}
		time.Sleep(200 * time.Millisecond)
	}

	killedAt := time.Now().Unix()
	d.Kill()
	time.Sleep(2 * time.Second) // distinct seconds on both sides
	d.Start()
	restartedAt := time.Now().Unix()
	t0 := time.Now()
	if out, res := d.execOut(t, sb.ID, "cat /work/data.bin | wc -c"); strings.TrimSpace(out) != strconv.Itoa(len(payload)) || res.ExitCode != 0 {
		t.Fatalf("exec after the daemon's restart: %q %+v", out, res)
	}
	t.Logf("first exec %v after the restarted daemon answered", time.Since(t0))
	ps, _, code := d.corral("ps", sb.ID)
	if code != 0 || !strings.Contains(ps, strconv.Itoa(pid)) || !strings.Contains(ps, "running") {
		t.Fatalf("ps after restart (%d):\n%s", code, ps)
	}
	attachAcrossRestart(t, d, sb.ID, pid, killedAt, restartedAt)
	st, err := d.Client.Stats(ctx, sb.ID)
	if err != nil || st.MemoryBytes <= 0 || st.Pids < 1 {
		t.Fatalf("stats: %+v, %v", st, err)
	}
	t.Logf("stats of a gVisor sandbox with a background process: %+v", st)
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Get(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("get after delete: %v", err)
	}
}

// bareRunscRun runs the bundle with `runsc run`, with the flags the driver
// uses, and returns the time until its first output byte.
func bareRunscRun(b testing.TB, bundle string) time.Duration {
	id := "corral-bare-" + randHex(4)
	root := bareRuntimeRoot(b, bundle, "runsc")
	flags := []string{"--root", root, "--platform=systrap", "--network=none", "--overlay2=none", "--oci-seccomp"}
	cmd := exec.Command("runsc", append(flags, "run", "--bundle", bundle, id)...)
	return firstOutputOf(b, cmd, func() {
		_ = exec.Command("runsc", "--root", root, "delete", "--force", id).Run()
	})
}

// BenchmarkColdStartGVisor is BenchmarkColdStart for the gvisor runtime:
// alternating, Corral's cold create of a gVisor sandbox until the first
// byte of `echo hi`, and a bare `runsc run` of the same busybox rootfs.
//
//	go test -run '^$' -bench ColdStartGVisor -benchtime 20x ./test/e2e
func BenchmarkColdStartGVisor(b *testing.B) {
	coldStart(b, startGVisorDaemon(b), "gvisor", "runsc-", bareRunscRun)
}

// BenchmarkExecRoundTripGVisor is BenchmarkExecRoundTrip on a gVisor
// sandbox: `exec true` through the SDK, the daemon and the agent's
// dialed-out connection.
//
//	go test -run '^$' -bench ExecRoundTripGVisor -benchtime 1000x ./test/e2e
func BenchmarkExecRoundTripGVisor(b *testing.B) {
	execRoundTrip(b, startGVisorDaemon(b), "gvisor")
}

// BenchmarkIdleMemoryGVisor starts b.N gVisor sandboxes, lets them settle,
// and reports their host cgroup memory (the Sentry, the gofer and the
// agent: what an idle sandbox costs the host).
//
//	go test -run '^$' -bench IdleMemoryGVisor -benchtime 10x ./test/e2e
func BenchmarkIdleMemoryGVisor(b *testing.B) {
	d := startGVisorDaemon(b)
	ctx := context.Background()
	var ids []string
	for i := 0; i < b.N; i++ {
		sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Runtime: "gvisor"})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	b.StopTimer()
	time.Sleep(3 * time.Second)
	var total int64
	for _, id := range ids {
		st, err := d.Client.Stats(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		total += st.MemoryBytes
	}
	b.ReportMetric(float64(total)/float64(len(ids))/(1<<20), "MiB/sandbox")
}
