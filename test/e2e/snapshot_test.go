package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/rootfs"
	corral "github.com/corralrun/corral/sdk"
)

// snapshotDir is where the daemon keeps snapshots.
func (d *daemon) snapshotDir() string { return filepath.Join(d.StateDir, "snapshots") }

// checkNoHalfSnapshots fails when the snapshot directory holds anything
// but the published snapshots the API lists.
func checkNoHalfSnapshots(t *testing.T, d *daemon) {
	t.Helper()
	list, err := d.Client.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range list {
		listed[s.Name] = true
	}
	entries, _ := os.ReadDir(d.snapshotDir())
	for _, e := range entries {
		if !listed[e.Name()] {
			t.Errorf("snapshot directory holds %s, which is not listed", e.Name())
		}
	}
}

func snapshotKind(t *testing.T, d *daemon, runtime string) string {
	t.Helper()
	rts, err := d.Client.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range rts.Runtimes {
		if rt.Name == runtime {
			return rt.Snapshot
		}
	}
	t.Fatalf("runtime %s not offered: %+v", runtime, rts.Runtimes)
	return ""
}

// TestSnapshotRunc: pause and resume through the freezer, and filesystem
// snapshots on runc with both storage backends: a file written before a
// snapshot is in a sandbox made from it, one written (or removed) after
// is not; snapshots outlive their sandbox and a daemon restart, become
// templates, and a damaged one is refused.
func TestSnapshotRunc(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		d := startDaemon(t, storage)
		ctx := t.Context()
		if k := snapshotKind(t, d, "runc"); k != corral.SnapshotFilesystem {
			t.Fatalf("runc advertises snapshot kind %q, want %q", k, corral.SnapshotFilesystem)
		}
		sb := d.create(t, corral.CreateOptions{Env: map[string]string{"FROM": "env"}})
		d.execOut(t, sb.ID, "mkdir -p /work/dir && echo before > /work/dir/before && rm /bin/vi && dd if=/dev/urandom of=/work/blob bs=64k count=16 2>/dev/null && md5sum /work/blob > /work/blob.md5")

		p, err := d.Client.Pause(ctx, sb.ID)
		if err != nil || p.State != "paused" {
			t.Fatalf("pause: %v %+v", err, p)
		}
		if _, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"}); corral.ErrorCode(err) != "failed_precondition" {
			t.Fatalf("exec in a paused sandbox: %v", err)
		}
		r, err := d.Client.Resume(ctx, sb.ID, corral.Timeout(10*time.Minute))
		if err != nil || r.State != "running" || r.Deadline == nil || r.Deadline.Before(time.Now().Add(9*time.Minute)) {
			t.Fatalf("resume: %v %+v", err, r)
		}

		snap, err := d.Client.CreateSnapshot(ctx, sb.ID, "base", map[string]string{"purpose": "test"})
		if err != nil {
			t.Fatal(err)
		}
		if snap.Kind != corral.SnapshotFilesystem || snap.SandboxID != sb.ID || snap.Metadata["purpose"] != "test" || snap.SizeBytes < 1<<20 {
			t.Fatalf("snapshot %+v", snap)
		}
		if _, err := d.Client.CreateSnapshot(ctx, sb.ID, "base", nil); corral.ErrorCode(err) != "already_exists" {
			t.Fatalf("second snapshot named base: %v", err)
		}
		if out, _ := d.execOut(t, sb.ID, "echo after > /work/after; rm /work/dir/before; echo ok"); out != "ok\n" {
			t.Fatalf("source after the snapshot: %q", out)
		}
		check := "cat /work/dir/before; test -e /work/after && echo after-present; test -e /bin/vi && echo vi-present; md5sum -c /work/blob.md5 >/dev/null && echo blob-ok; echo $FROM"
		want := "before\nblob-ok\nenv\n"
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}

		restored := d.create(t, corral.CreateOptions{FromSnapshot: "base"})
		if out, _ := d.execOut(t, restored.ID, check); out != want {
			t.Fatalf("sandbox from the snapshot: %q, want %q", out, want)
		}

		copies, err := d.Client.Fork(ctx, restored.ID, 2)
		if err != nil {
			t.Fatal(err)
		}
		d.execOut(t, copies[0].ID, "echo mine > /work/dir/before")
		for i, c := range copies {
			w := want
			if i == 0 {
				w = "mine\n" + strings.TrimPrefix(want, "before\n")
			}
			if out, _ := d.execOut(t, c.ID, check); out != w {
				t.Errorf("fork copy %d: %q, want %q", i, out, w)
			}
		}

		d.Stop()
		d.Start()
		list, err := d.Client.Snapshots(ctx)
		if err != nil || len(list) != 1 || list[0].Name != "base" {
			t.Fatalf("snapshots after a restart: %v %+v", err, list)
		}
		again := d.create(t, corral.CreateOptions{FromSnapshot: "base"})
		if out, _ := d.execOut(t, again.ID, check); out != want {
			t.Fatalf("sandbox from the snapshot after a restart: %q", out)
		}
		if _, err := d.Client.TemplateFromSnapshot(ctx, "frombase", "base"); err != nil {
			t.Fatal(err)
		}
		fromTpl := d.create(t, corral.CreateOptions{Template: "frombase"})
		if out, _ := d.execOut(t, fromTpl.ID, "cat /work/dir/before; test -e /bin/vi || echo no-vi"); out != "before\nno-vi\n" {
			t.Fatalf("sandbox of the template made from the snapshot: %q", out)
		}

		// Damage: one flipped byte in the saved files.
		f, err := os.OpenFile(filepath.Join(d.snapshotDir(), "base", "files.tar"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff}, 4096); err != nil {
			t.Fatal(err)
		}
		f.Close()
		_, err = d.Client.Create(ctx, corral.CreateOptions{FromSnapshot: "base"})
		if corral.ErrorCode(err) != "failed_precondition" || !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("restore of a damaged snapshot: %v", err)
		}
		if err := d.Client.DeleteSnapshot(ctx, "base"); err != nil {
			t.Fatal(err)
		}
		checkNoHalfSnapshots(t, d)
	})
}

// TestSnapshotDurability SIGKILLs the daemon at random points of 20
// snapshot operations, on runc (files) and gVisor (files and memory).
// After each restart the source sandbox runs, and every listed snapshot
// restores with the data it was taken with.
func TestSnapshotDurability(t *testing.T) {
	// The kill comes within window of the request: about twice what a
	// snapshot usually takes, so that some finish and most do not.
	t.Run("runc", func(t *testing.T) { snapshotDurability(t, startDaemon(t, e2eStorage), "runc", 300*time.Millisecond) })
	t.Run("gvisor", func(t *testing.T) { snapshotDurability(t, startGVisorDaemon(t), "gvisor", 1500*time.Millisecond) })
}

func snapshotDurability(t *testing.T, d *daemon, runtime string, window time.Duration) {
	ctx := t.Context()
	sb := d.create(t, corral.CreateOptions{Runtime: runtime, Timeout: corral.Timeout(time.Hour)})
	// 16 MiB of changed files, so that a snapshot takes long enough to
	// be killed in the middle of.
	d.execOut(t, sb.ID, "mkdir /work && dd if=/dev/urandom of=/work/blob bs=1M count=16 2>/dev/null && md5sum /work/blob > /work/blob.md5")
	rng := rand.New(rand.NewPCG(8, uint64(time.Now().UnixNano())))
	completed := 0
	for i := range 20 {
		name := fmt.Sprintf("d%d", i)
		d.execOut(t, sb.ID, "echo "+name+" > /work/name")
		done := make(chan error, 1)
		go func() {
			_, err := d.Client.CreateSnapshot(context.Background(), sb.ID, name, nil)
			done <- err
		}()
		time.Sleep(time.Duration(rng.Int64N(int64(window))))
		d.Kill()
		if err := <-done; err == nil {
			completed++
		}
		d.Start()
		if out, res := d.execOut(t, sb.ID, "cat /work/name"); out != name+"\n" || res.ExitCode != 0 {
			t.Fatalf("round %d: source sandbox after the restart: %q %+v", i, out, res)
		}
		checkNoHalfSnapshots(t, d)
	}
	list, err := d.Client.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 20 snapshots were answered before the kill; %d are listed; the sandbox was found frozen and thawed %d times",
		completed, len(list), strings.Count(d.Logs(), "resuming sandbox frozen"))
	for _, s := range list {
		c := d.create(t, corral.CreateOptions{FromSnapshot: s.Name})
		if out, _ := d.execOut(t, c.ID, "cat /work/name; md5sum -c /work/blob.md5 >/dev/null && echo ok"); out != s.Name+"\nok\n" {
			t.Errorf("snapshot %s restores as %q", s.Name, out)
		}
		if err := d.Client.Delete(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
		if err := d.Client.DeleteSnapshot(ctx, s.Name); err != nil {
			t.Fatal(err)
		}
	}
}

// importPythonTemplate makes template name from busybox and the host's
// python3.11 with its libraries and the few stdlib files it needs at
// start (python3 -I -S).
func importPythonTemplate(t testing.TB, d *daemon, name string) {
	t.Helper()
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("python3 is needed for this test: %v", err)
	}
	lib := "/usr/lib/" + filepath.Base(py)
	dir := t.TempDir()
	if err := rootfs.FillBusybox(dir, ""); err != nil {
		t.Fatal(err)
	}
	files := []string{py, lib + "/os.py"}
	out, err := exec.Command("ldd", py).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			files = append(files, f)
		}
	}
	for _, f := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command("cp", "-L", f, filepath.Join(dir, f)).Run(); err != nil {
			t.Fatalf("copying %s: %v", f, err)
		}
	}
	if err := exec.Command("cp", "-r", lib+"/encodings", filepath.Join(dir, lib)).Run(); err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll(filepath.Join(dir, lib, "lib-dynload"), 0o755)
	if err := os.Symlink(filepath.Base(py), filepath.Join(dir, "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	tar := exec.Command("tar", "-C", dir, "-cf", "-", ".")
	tar.Stdout = &tarball
	if err := tar.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.ImportTemplate(t.Context(), name, &tarball); err != nil {
		t.Fatal(err)
	}
}

// counterProgram keeps a counter in memory only: every 20 ms it adds the
// number in /tmp/step (1 if absent) while /tmp/run exists, and writes the
// value to /tmp/n. It never reads /tmp/n back.
const counterProgram = `
import os, time
n = 0
while True:
    if os.path.exists("/tmp/run"):
        try:
            n += int(open("/tmp/step").read())
        except OSError:
            n += 1
    with open("/tmp/n.tmp", "w") as f:
        f.write(str(n))
    os.rename("/tmp/n.tmp", "/tmp/n")
    time.sleep(0.02)
`

func counter(t *testing.T, d *daemon, id string) int {
	t.Helper()
	out, _ := d.execOut(t, id, "cat /tmp/n")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("counter of %s: %q", id, out)
	}
	return n
}

// TestSnapshotGVisor: on gVisor a fork continues the running processes in
// every copy: a Python counter forked 4 ways goes on from the value it
// had in each copy, and then each copy counts on its own. A memory
// snapshot restores files written before it and not those written after,
// and its processes.
func TestSnapshotGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	ctx := t.Context()
	if k := snapshotKind(t, d, "gvisor"); k != corral.SnapshotMemory {
		t.Fatalf("gvisor advertises snapshot kind %q, want %q", k, corral.SnapshotMemory)
	}
	importPythonTemplate(t, d, "py")
	sb := d.create(t, corral.CreateOptions{Template: "py", Runtime: "gvisor", MemoryMB: 256, Pids: 128})
	if _, err := d.Client.StartProcess(ctx, sb.ID, corral.StartOptions{Cmd: []string{"python3", "-I", "-S", "-c", counterProgram}, Tag: "counter"}); err != nil {
		t.Fatal(err)
	}
	d.execOut(t, sb.ID, "touch /tmp/run; echo before > /root/before")
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := d.execOut(t, sb.ID, "cat /tmp/n 2>/dev/null || echo 0")
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n >= 20 {
			break
		}
		if time.Now().After(deadline) {
			ps, _, _ := d.corral("ps", sb.ID)
			logs, _, _ := d.corral("logs", sb.ID, "counter")
			t.Fatalf("the counter does not count: %q\n%s\n%s", out, ps, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Stop counting, so that the fork sees one value everywhere.
	d.execOut(t, sb.ID, "rm /tmp/run")
	time.Sleep(100 * time.Millisecond)
	v := counter(t, d, sb.ID)

	copies, err := d.Client.Fork(ctx, sb.ID, 4)
	if err != nil {
		t.Fatal(err)
	}
	steps := []int{1000, 10000, 100000, 1000000}
	for i, c := range copies {
		if got := counter(t, d, c.ID); got != v {
			t.Errorf("copy %d starts at %d, want %d", i, got, v)
		}
		d.execOut(t, c.ID, fmt.Sprintf("echo %d > /tmp/step; touch /tmp/run", steps[i]))
	}
	time.Sleep(500 * time.Millisecond)
	var wg sync.WaitGroup
	for i, c := range copies {
		got := counter(t, d, c.ID)
		if got <= v || (got-v)%steps[i] != 0 {
			t.Errorf("copy %d counts %d from %d: not in steps of %d of its own", i, got, v, steps[i])
		}
		wg.Go(func() { _ = d.Client.Delete(context.Background(), c.ID) })
	}
	wg.Wait()
	if got := counter(t, d, sb.ID); got != v {
		t.Errorf("the source counted on to %d while stopped at %d", got, v)
	}

	if _, err := d.Client.CreateSnapshot(ctx, sb.ID, "mem", nil); err != nil {
		t.Fatal(err)
	}
	d.execOut(t, sb.ID, "echo after > /root/after; touch /tmp/run")
	restored := d.create(t, corral.CreateOptions{FromSnapshot: "mem"})
	if restored.Runtime != "gvisor" {
		t.Fatalf("restored on %s", restored.Runtime)
	}
	if out, _ := d.execOut(t, restored.ID, "cat /root/before; test -e /root/after && echo after-present; test -e /tmp/run && echo running"); out != "before\n" {
		t.Fatalf("restored files: %q", out)
	}
	if got := counter(t, d, restored.ID); got != v {
		t.Errorf("restored counter %d, want %d", got, v)
	}
	d.execOut(t, restored.ID, "touch /tmp/run")
	time.Sleep(300 * time.Millisecond)
	if got := counter(t, d, restored.ID); got <= v {
		t.Errorf("restored counter does not count: %d", got)
	}
	if _, err := d.Client.Create(ctx, corral.CreateOptions{FromSnapshot: "mem", Runtime: "runc"}); corral.ErrorCode(err) != "invalid_argument" {
		t.Errorf("memory snapshot on runc: %v", err)
	}
	if err := d.Client.DeleteSnapshot(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	checkNoHalfSnapshots(t, d)
}

// TestSnapshotCLI drives pause, resume, snapshot, create --from-snapshot
// and fork through the command line.
func TestSnapshotCLI(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := d.corral(args...)
		if code != 0 {
			t.Fatalf("corral %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	id := strings.TrimSpace(run("create", "--template", "bb"))
	run("exec", id, "--", "sh", "-c", "echo cli > /marker")
	if out := run("pause", id); out != id+"\n" {
		t.Fatalf("pause printed %q", out)
	}
	if _, _, code := d.corral("exec", id, "--", "true"); code == 0 {
		t.Fatal("exec in a paused sandbox succeeded")
	}
	run("resume", "--timeout", "5m", id)
	run("snapshot", "create", "--metadata", "k=v", id, "cli-snap")
	if out := run("snapshot", "ls"); !strings.Contains(out, "cli-snap") || !strings.Contains(out, "filesystem") {
		t.Fatalf("snapshot ls:\n%s", out)
	}
	fromSnap := strings.TrimSpace(run("create", "--from-snapshot", "cli-snap"))
	if out := run("exec", fromSnap, "--", "cat", "/marker"); out != "cli\n" {
		t.Fatalf("sandbox from the snapshot: %q", out)
	}
	ids := strings.Fields(run("fork", "--count", "2", fromSnap))
	if len(ids) != 2 {
		t.Fatalf("fork printed %q", ids)
	}
	for _, c := range ids {
		if out := run("exec", c, "--", "cat", "/marker"); out != "cli\n" {
			t.Fatalf("fork copy: %q", out)
		}
	}
	run("snapshot", "template", "cli-snap", "cli-tpl")
	if out := run("run", "--template", "cli-tpl", "--", "cat", "/marker"); out != "cli\n" {
		t.Fatalf("sandbox of the template: %q", out)
	}
	run("snapshot", "rm", "cli-snap")
	if _, _, code := d.corral("snapshot", "rm", "cli-snap"); code == 0 {
		t.Fatal("removing a removed snapshot succeeded")
	}
	checkNoHalfSnapshots(t, d)
}

// TestForkNetworkGVisor: a fork of a gVisor sandbox with a network gets a
// network of its own: restored netstacks take the new namespace's address,
// and its resolver is the copy's.
func TestForkNetworkGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	policy := &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"example.com"}}
	sb := d.create(t, corral.CreateOptions{Runtime: "gvisor", Network: policy})
	addr := func(id string) (inet, nameserver string) {
		out, _ := d.execOut(t, id, "ip -4 addr show eth0 | sed -n 's/.*inet \\([0-9.]*\\).*/\\1/p'; sed -n 's/^nameserver //p' /etc/resolv.conf")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("address and resolver of %s: %q", id, out)
		}
		return f[0], f[1]
	}
	srcAddr, _ := addr(sb.ID)
	copies, err := d.Client.Fork(t.Context(), sb.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{srcAddr: true}
	for _, c := range copies {
		if c.Network == nil || c.Network.Mode != "allowlist" {
			t.Errorf("copy %s has network %+v", c.ID, c.Network)
		}
		a, ns := addr(c.ID)
		if seen[a] {
			t.Errorf("copy %s has address %s, already in use", c.ID, a)
		}
		seen[a] = true
		// The resolver is the host end of the copy's own /30.
		if ip, err := netip.ParseAddr(a); err != nil || ip.Prev().String() != ns {
			t.Errorf("copy %s: address %s, resolver %s", c.ID, a, ns)
		}
	}
}

// TestSnapshotPausedGVisor: a paused gVisor sandbox can be forked and
// snapshotted; the copies run while the source stays paused. A second
// memory save in the same pause is refused (runsc fails on it) until a
// resume.
func TestSnapshotPausedGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	ctx := t.Context()
	sb := d.create(t, corral.CreateOptions{Runtime: "gvisor"})
	d.execOut(t, sb.ID, "echo kept > /root/f")
	if _, err := d.Client.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	copies, err := d.Client.Fork(ctx, sb.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := d.execOut(t, copies[0].ID, "cat /root/f"); out != "kept\n" {
		t.Fatalf("copy of a paused sandbox: %q", out)
	}
	if got, _ := d.Client.Get(ctx, sb.ID); got.State != "paused" {
		t.Fatalf("source is %s after the fork", got.State)
	}
	if _, err := d.Client.CreateSnapshot(ctx, sb.ID, "p", nil); corral.ErrorCode(err) != "failed_precondition" {
		t.Fatalf("second memory save in one pause: %v", err)
	}
	if _, err := d.Client.Resume(ctx, sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.CreateSnapshot(ctx, sb.ID, "p", nil); err != nil {
		t.Fatal(err)
	}
	c := d.create(t, corral.CreateOptions{FromSnapshot: "p"})
	if out, _ := d.execOut(t, c.ID, "cat /root/f"); out != "kept\n" {
		t.Fatalf("sandbox from a snapshot of a paused sandbox: %q", out)
	}
	if _, err := d.Client.Resume(ctx, sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	if out, _ := d.execOut(t, sb.ID, "cat /root/f"); out != "kept\n" {
		t.Fatalf("source after resume: %q", out)
	}
}
