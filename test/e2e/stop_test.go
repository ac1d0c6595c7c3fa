package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver/gvisor/gvisortest"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestStopStart stops a sandbox with a network and host-directory mounts
// through the CLI on runc and gVisor, checks that nothing of it runs,
// mounts or holds a network while it is stopped and that exec is refused,
// starts it again and finds its files (its root's and its cow mount's
// changes), its environment and its ID.
func TestStopStart(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, e2eStorage, "--allow-mount", allowed, "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testStopStart(t, d, mountRoot(t, allowed, "stop-"+rt), rt) })
	}
}

func testStopStart(t *testing.T, d *daemon, root, rt string) {
	ctx := t.Context()
	sb := d.create(t, corral.CreateOptions{Runtime: rt, Env: map[string]string{"KEPT": "env"},
		Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist, AllowCIDRs: []string{"192.0.2.0/24"}},
		Mounts: []corral.Mount{
			{Source: filepath.Join(root, "ro"), Target: "/data", Mode: corral.MountReadOnly},
			{Source: filepath.Join(root, "cow"), Target: "/cow", Mode: corral.MountCopyOnWrite},
		}})
	if out, res := d.execOut(t, sb.ID, "echo kept > /root/note && echo changed > /cow/hello"); res.ExitCode != 0 {
		t.Fatalf("writing: exit %d, %q", res.ExitCode, out)
	}
	if out, stderr, code := d.corral("stop", sb.ID); code != 0 || out != sb.ID+"\n" {
		t.Fatalf("corral stop: exit %d, %q, %q", code, out, stderr)
	}
	checkStoppedOnHost(t, d, root, sb.ID)
	if out, _, code := d.corral("ls"); code != 0 || !strings.Contains(out, sb.ID) || !strings.Contains(out, "stopped") {
		t.Errorf("corral ls: exit %d, %q; want the sandbox stopped", code, out)
	}
	_, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"})
	if corral.ErrorCode(err) != corral.CodeFailedPrecondition || !strings.Contains(err.Error(), "start it first") {
		t.Errorf("exec while stopped: %v; want failed_precondition saying to start it", err)
	}
	if out, stderr, code := d.corral("start", sb.ID); code != 0 || out != sb.ID+"\n" {
		t.Fatalf("corral start: exit %d, %q, %q\nlogs:\n%s", code, out, stderr, d.Logs())
	}
	got, err := d.Client.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || got.Network == nil || got.Network.Mode != corral.NetworkAllowlist {
		t.Fatalf("after start: %v %+v", err, got)
	}
	if out, res := d.execOut(t, sb.ID, "cat /root/note /cow/hello /data/hello; echo $KEPT"); res.ExitCode != 0 || out != "kept\nchanged\nhello ro\nenv\n" {
		t.Errorf("after start: exit %d, %q", res.ExitCode, out)
	}
	// On runc a start may run it in another host ID range: what it changed
	// before is still its own to change.
	if out, res := d.execOut(t, sb.ID, "echo again >> /cow/hello && cat /cow/hello"); res.ExitCode != 0 || out != "changed\nagain\n" {
		t.Errorf("changing a cow file after start: exit %d, %q", res.ExitCode, out)
	}
	checkHostFile(t, filepath.Join(root, "cow", "hello"), "hello cow\n")
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkUnmounted(t, root, sb.ID)
}

// checkStoppedOnHost checks that stopped sandbox id has no process,
// container, cgroup, mount or network left and holds no admission claim.
func checkStoppedOnHost(t *testing.T, d *daemon, root, id string) {
	t.Helper()
	if sb, err := d.Client.Get(t.Context(), id); err != nil || sb.State != corral.StateStopped || sb.Deadline != nil {
		t.Fatalf("stopped sandbox: %v %+v", err, sb)
	}
	if p := testutil.ProcessesWithRoot(t, d.StateDir); len(p) > 0 {
		t.Errorf("processes left while stopped: %v", p)
	}
	if c := testutil.CgroupDirs(t, d.Cgroup); len(c) > 0 {
		t.Errorf("cgroups left while stopped: %v", c)
	}
	out, err := exec.Command("runc", "--root", filepath.Join(d.RunDir, "runc", "state"), "list", "-q").Output()
	if err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("runc containers left while stopped: %s", out)
	}
	if g := gvisortest.Leftovers(filepath.Join(d.RunDir, "gvisor")); len(g) > 0 {
		t.Errorf("gVisor sandboxes left while stopped: %v", g)
	}
	// The network's namespace is mounted under the run dir, by the ID.
	checkUnmounted(t, root, id)
	for _, f := range testutil.Files(t, d.RunDir) {
		if strings.Contains(f, id) {
			t.Errorf("left in the run dir while stopped: %s", f)
		}
	}
	for _, r := range []string{"sandboxes", "memory_bytes", "millicpus"} {
		if n := metricValue(t, d, `corral_admission_committed{resource="`+r+`"}`); n != 0 {
			t.Errorf("admission commits %g %s while the only sandbox is stopped", n, r)
		}
	}
}

// metricValue reads one series, named with its labels, from the
// daemon's metrics.
func metricValue(t *testing.T, d *daemon, series string) float64 {
	t.Helper()
	text, err := d.Client.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	t.Fatalf("metric %s not found", series)
	return 0
}

// TestStoppedSurvivesRestartAndReboot stops a sandbox, restarts the
// daemon, then stops it again and takes down what a host reboot takes
// down (every mount of the daemon and its run dir), and starts the
// sandbox on the daemon started afterwards: its files are there.
func TestStoppedSurvivesRestartAndReboot(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		d := startDaemon(t, storage)
		ctx := t.Context()
		sb := d.create(t, corral.CreateOptions{})
		d.execOut(t, sb.ID, "echo persisted > /root/note")
		if _, err := d.Client.Stop(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		d.Stop()
		d.Start()
		if got, err := d.Client.Get(ctx, sb.ID); err != nil || got.State != corral.StateStopped {
			t.Fatalf("after a restart: %v %+v; want stopped", err, got)
		}
		if _, err := d.Client.Start(ctx, sb.ID, nil); err != nil {
			t.Fatalf("start after a restart: %v\nlogs:\n%s", err, d.Logs())
		}
		if out, _ := d.execOut(t, sb.ID, "cat /root/note"); out != "persisted\n" {
			t.Fatalf("after a restart and a start: %q", out)
		}
		if _, err := d.Client.Stop(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		d.Stop()
		simulateReboot(t, d)
		d.Start()
		if _, err := d.Client.Start(ctx, sb.ID, nil); err != nil {
			t.Fatalf("start after a reboot: %v\nlogs:\n%s", err, d.Logs())
		}
		if out, _ := d.execOut(t, sb.ID, "cat /root/note && echo works"); out != "persisted\nworks\n" {
			t.Fatalf("after a reboot and a start: %q", out)
		}
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	})
}

// simulateReboot takes down, with the daemon stopped, what a reboot
// takes down of it: its mounts under the state dir (deepest first, so the
// roots' and templates' mounts before a btrfs image's) and the run dir.
func simulateReboot(t *testing.T, d *daemon) {
	t.Helper()
	if p := testutil.ProcessesWithRoot(t, d.StateDir); len(p) > 0 {
		t.Fatalf("sandbox processes run before the simulated reboot: %v", p)
	}
	mounts := append(testutil.Mounts(t, d.RunDir), testutil.Mounts(t, d.StateDir)...)
	if len(mounts) == 0 {
		t.Fatal("the stopped daemon has no mounts: nothing to take down")
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], 0); err != nil {
			t.Fatalf("unmounting %s: %v", mounts[i], err)
		}
	}
	if left := testutil.Mounts(t, d.StateDir); len(left) > 0 {
		t.Fatalf("still mounted: %v", left)
	}
	if err := os.RemoveAll(d.RunDir); err != nil {
		t.Fatal(err)
	}
}

// TestIdleStop checks that --on-idle stop stops an idle sandbox instead
// of deleting it, and that it starts again; and that a stopped sandbox
// deletes without leaks.
func TestIdleStop(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	ctx := t.Context()
	out, stderr, code := d.corral("create", "--template", "bb", "--idle-timeout", "1s", "--on-idle", "stop")
	if code != 0 {
		t.Fatalf("corral create --on-idle stop: exit %d, %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		sb, err := d.Client.Get(ctx, id)
		if err != nil {
			t.Fatalf("the idle sandbox: %v", err)
		}
		if sb.State == corral.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle sandbox is %s after 20s, want stopped", sb.State)
		}
	}
	if _, err := d.Client.Start(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	d.execOut(t, id, "true")
	if err := d.Client.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	// A stopped sandbox deletes cleanly (the daemon's leak checks follow).
	sb := d.create(t, corral.CreateOptions{})
	d.execOut(t, sb.ID, "echo x > /root/x")
	if _, err := d.Client.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, code := d.corral("rm", sb.ID); code != 0 {
		t.Fatalf("corral rm of a stopped sandbox: exit %d", code)
	}
	if _, err := d.Client.Get(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("a deleted stopped sandbox: %v", err)
	}
}

// TestStopStartThroughCrash SIGKILLs the daemon while stops, then starts,
// are in flight, restarts it, and checks that every sandbox is stopped or
// running, never in between, that each one works after a start, and that
// nothing leaks once they are deleted.
func TestStopStartThroughCrash(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	ctx := t.Context()
	var ids []string
	for range 4 {
		sb := d.create(t, corral.CreateOptions{})
		d.execOut(t, sb.ID, "echo "+sb.ID+" > /root/id")
		ids = append(ids, sb.ID)
	}
	for _, op := range []string{"stop", "start"} {
		crashDuring(t, d, ids, op)
		d.Start()
		for _, id := range ids {
			sb, err := d.Client.Get(ctx, id)
			if err != nil || (sb.State != "running" && sb.State != corral.StateStopped) {
				t.Fatalf("after a crash during %s: %v %+v; want running or stopped", op, err, sb)
			}
			t.Logf("after a crash during %s: %s is %s", op, id, sb.State)
		}
	}
	for _, id := range ids {
		if _, err := d.Client.Start(ctx, id, nil); err != nil {
			t.Fatalf("start of %s: %v\nlogs:\n%s", id, err, d.Logs())
		}
		if out, _ := d.execOut(t, id, "cat /root/id"); out != id+"\n" {
			t.Errorf("%s reads %q", id, out)
		}
		if err := d.Client.Delete(ctx, id); err != nil {
			t.Errorf("deleting %s: %v", id, err)
		}
	}
}

// crashDuring runs op (stop or start) on every sandbox of ids at once and
// kills the daemon once the first has returned.
func crashDuring(t *testing.T, d *daemon, ids []string, op string) {
	t.Helper()
	var once sync.Once
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var err error
			if op == "stop" {
				_, err = d.Client.Stop(ctx, id)
			} else {
				_, err = d.Client.Start(ctx, id, nil)
			}
			if err == nil {
				once.Do(d.Kill)
			}
		}()
	}
	wg.Wait()
	once.Do(d.Kill)
}
