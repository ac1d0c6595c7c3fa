package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestRunAgainstDaemon starts a real daemon (runc, overlay storage, busybox
// template) and runs every scenario with tiny sizes, runc and runsc as the
// peers.
func TestRunAgainstDaemon(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "runsc")
	testutil.RequiresBinary(t, "busybox")
	bin := testutil.CorralBinary(t)
	base, err := os.MkdirTemp("", "corral-bench-") // short: socket paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	socket := filepath.Join(base, "corral.sock")
	cgroup := "/corral-bench-" + randHex(4)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "server", "--state-dir", filepath.Join(base, "state"), "--socket", socket,
		"--storage", "overlay", "--cgroup-parent", cgroup)
	// The daemon's sandbox networks: its own subnet, interfaces and table.
	cmd.Args = append(cmd.Args, testutil.NewDaemonNetwork(t).Args(nil)...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting daemon: %v", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		for _, c := range testutil.CgroupDirs(t, cgroup) {
			t.Errorf("leaked cgroup %s", c)
		}
		roots, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, r := range append(roots, "/sys/fs/cgroup") {
			_ = os.Remove(filepath.Join(r, cgroup))
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", logs.String())
		}
	}()
	host := "unix://" + socket
	c, err := corral.New(host, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	waitReady(t, ctx, c)
	if _, err := c.BuildTemplate(ctx, "bb", corral.BuildOptions{Recipe: "busybox"}, nil); err != nil {
		t.Fatalf("building busybox template: %v", err)
	}

	rep, err := Run(ctx, Options{Runtime: "runc", Template: "bb", Iterations: 3, Burst: 5, Density: 3,
		Peers: []string{PeerRunc, PeerRunsc}, Host: host, Command: "test"}, c)
	var table bytes.Buffer
	_ = PrintTable(&table, rep)
	t.Logf("report:\n%s", table.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	byScenario := map[string]Row{}
	for _, r := range rep.Rows {
		byScenario[r.Scenario+"/"+r.Runtime] = r
	}
	for _, key := range []string{ScenarioExec + "/runc", ScenarioCold + "/runc", ScenarioWarm + "/runc", ScenarioPeer + "/runc",
		ScenarioPeer + "/runsc", ScenarioPeerExec + "/runc", ScenarioPeerExec + "/runsc", ScenarioBurst + "/runc", ScenarioDensity + "/runc"} {
		r, ok := byScenario[key]
		if !ok || r.P50MS == nil || *r.P50MS <= 0 || r.N == 0 {
			t.Errorf("row %s missing or without samples: %+v", key, r)
		}
	}
	if w := byScenario[ScenarioWarm+"/runc"]; w.N != 3 {
		t.Errorf("warm row = %+v, want 3 claims", w)
	}
	if pools, err := c.Pools(ctx); err != nil || len(pools) != 0 {
		t.Errorf("pools left after Run: %v (err %v)", pools, err)
	}
	if b := byScenario[ScenarioBurst+"/runc"]; b.N != 5 || b.Metrics["created"] != 5 || b.Metrics["creates_per_s"] <= 0 {
		t.Errorf("burst created %d of 5: %s", b.N, b.Extra)
	}
	d := byScenario[ScenarioDensity+"/runc"]
	if _, ok := d.Metrics["daemon_rss_bytes_per_sandbox"]; !ok || d.Metrics["memory_bytes_per_sandbox"] <= 0 {
		t.Errorf("density metrics = %v, want memory and daemon RSS per sandbox", d.Metrics)
	}
	for _, key := range []string{ScenarioPeer + "/runc", ScenarioPeerExec + "/runc", ScenarioPeerExec + "/runsc"} {
		if _, ok := byScenario[key].Metrics["corral_ratio_p50"]; !ok {
			t.Errorf("peer row %s has no ratio: %+v", key, byScenario[key])
		}
	}
	if n := byScenario[ScenarioPeerExec+"/runc"].N; n != 3 {
		t.Errorf("peer exec samples = %d, want 3 (warm-up execs untimed)", n)
	}
	// The peers' exec targets are gone with their containers.
	if procs, _ := filepath.Glob("/proc/[0-9]*/cmdline"); len(procs) > 0 {
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && string(b) == "sleep\x001000000\x00" {
				t.Errorf("peer exec target still running: %s", filepath.Dir(p))
			}
		}
	}
	if left, err := c.List(ctx, corral.ListOptions{}); err != nil || len(left) != 0 {
		t.Errorf("sandboxes left after Run: %v (err %v)", left, err)
	}
	if m, _ := filepath.Glob(filepath.Join(os.TempDir(), "corral-bench-*", "rootfs")); len(m) > 0 {
		t.Errorf("peer bundles left: %v", m)
	}
}

func waitReady(t *testing.T, ctx context.Context, c *corral.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Version(cctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not come up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
