package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestVolumes makes volumes on btrfs and mounts them in runc and gVisor
// sandboxes: two sandboxes that mount one at once see each other's
// writes, a ro mount refuses writes, the size limit stops writes, the
// file API reads what a sandbox wrote and a sandbox sees what the API
// wrote as its root's, a volume in use cannot be deleted, and a volume
// outlives its sandboxes and a daemon restart. Nothing stays mounted.
func TestVolumes(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, "btrfs", "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testVolumeShared(t, d, rt, "vol-"+rt) })
	}
	d.Stop()
	d.Start()
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt+"/after restart", func(t *testing.T) { testVolumeAfterRestart(t, d, rt, "vol-"+rt) })
	}
	testVolumesCLI(t, d)
}

func testVolumeShared(t *testing.T, d *daemon, rt, vol string) {
	ctx := t.Context()
	if _, err := d.Client.CreateVolume(ctx, vol, corral.VolumeOptions{SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	a := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/data"}}})
	b := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/shared", Mode: corral.MountReadWrite}}})
	ro := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/data", Mode: corral.MountReadOnly}}})

	mustExec(t, d, a.ID, "echo from a > /data/from-a")
	if out, _ := d.execOut(t, b.ID, "cat /shared/from-a"); out != "from a\n" {
		t.Errorf("b reads a's write as %q", out)
	}
	mustExec(t, d, b.ID, "mkdir -p /shared/dir && echo from b > /shared/dir/from-b")
	if out, _ := d.execOut(t, a.ID, "cat /data/dir/from-b; stat -c %u:%g /data/dir/from-b"); out != "from b\n0:0\n" {
		t.Errorf("a reads b's write and its owner as %q, want the content and 0:0", out)
	}
	if out, res := d.execOut(t, ro.ID, "cat /data/from-a && ! (echo x > /data/ro) 2>/dev/null"); res.ExitCode != 0 || out != "from a\n" {
		t.Errorf("ro mount: exit %d, %q; want it readable and unwritable", res.ExitCode, out)
	}
	if out, res := d.execOut(t, a.ID, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; rc=$?; rm -f /data/big; exit $rc"); res.ExitCode == 0 {
		t.Errorf("wrote 64 MiB into a 32 MiB volume: %s", out)
	}

	// The file API reads what a sandbox wrote; a sandbox sees what the
	// API wrote as its root's.
	rc, err := d.Client.VolumeReadFile(ctx, vol, "/dir/from-b")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "from b\n" {
		t.Errorf("VolumeReadFile = %q", got)
	}
	if fi, err := d.Client.VolumeStat(ctx, vol, "/from-a"); err != nil || fi.UID != 0 || fi.GID != 0 {
		t.Errorf("VolumeStat of a sandbox root's file: %+v, %v; want 0:0", fi, err)
	}
	if _, err := d.Client.VolumeWriteFile(ctx, vol, "/api/note", strings.NewReader("from api"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := d.execOut(t, a.ID, "cat /data/api/note; echo; stat -c %u:%g /data/api/note /data/api && echo ok >> /data/api/note"); out != "from api\n0:0\n0:0\n" {
		t.Errorf("the sandbox sees the API's file as %q, want its content, owned by 0:0, and writable", out)
	}

	v, err := d.Client.Volume(ctx, vol)
	if err != nil || len(v.InUseBy) != 3 {
		t.Errorf("volume in use: %+v, %v; want 3 users", v, err)
	}
	if err := d.Client.DeleteVolume(ctx, vol); corral.ErrorCode(err) != corral.CodeFailedPrecondition || !strings.Contains(err.Error(), a.ID) {
		t.Errorf("delete of a volume in use = %v, want failed_precondition naming %s", err, a.ID)
	}
	for _, sb := range []*corral.Sandbox{a, b, ro} {
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, sb := range []*corral.Sandbox{a, b, ro} {
		checkUnmounted(t, filepath.Join(d.StateDir, "volumes", vol), sb.ID)
	}
	if v, err := d.Client.Volume(ctx, vol); err != nil || len(v.InUseBy) != 0 || v.UsedBytes <= 0 {
		t.Errorf("volume after its sandboxes went: %+v, %v", v, err)
	}
}

func mustExec(t *testing.T, d *daemon, id, shell string) {
	t.Helper()
	if out, res := d.execOut(t, id, shell); res.ExitCode != 0 {
		t.Fatalf("%s: exit %d, %s", shell, res.ExitCode, out)
	}
}

// testVolumeAfterRestart checks that the volume and its files are there
// after a restart, for the API and for a new sandbox, and deletes it.
func testVolumeAfterRestart(t *testing.T, d *daemon, rt, vol string) {
	ctx := t.Context()
	if _, err := d.Client.Volume(ctx, vol); err != nil {
		t.Fatalf("volume after restart: %v", err)
	}
	sb := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/v", Mode: corral.MountCopyOnWrite}}})
	if out, _ := d.execOut(t, sb.ID, "cat /v/from-a /v/dir/from-b && echo cow > /v/from-a"); out != "from a\nfrom b\n" {
		t.Errorf("a sandbox after restart reads %q", out)
	}
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	rc, err := d.Client.VolumeReadFile(ctx, vol, "/from-a")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "from a\n" {
		t.Errorf("a cow mount changed the volume: %q", got)
	}
	if err := d.Client.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
}

// testVolumesCLI drives corral volume and -v NAME:DST.
func testVolumesCLI(t *testing.T, d *daemon) {
	if out, stderr, code := d.corral("volume", "create", "cli", "--label", "k=v"); code != 0 || out != "cli\n" {
		t.Fatalf("corral volume create: exit %d, %q %s", code, out, stderr)
	}
	if _, stderr, code := d.corral("run", "--template", "bb", "-v", "cli:/c", "--", "sh", "-c", "echo hi > /c/f"); code != 0 {
		t.Fatalf("corral run -v cli:/c: exit %d, %s", code, stderr)
	}
	out, _, code := d.corral("volume", "ls", "--json")
	var list []corral.Volume
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 1 || list[0].Labels["k"] != "v" {
		t.Fatalf("corral volume ls --json: exit %d, %v, %s", code, err, out)
	}
	if out, _, code := d.corral("volume", "inspect", "cli"); code != 0 || !strings.Contains(out, `"name": "cli"`) {
		t.Errorf("corral volume inspect: exit %d, %s", code, out)
	}
	if _, stderr, code := d.corral("run", "--template", "bb", "-v", "nope:/c", "--", "true"); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("run with a missing volume: exit %d, %s", code, stderr)
	}
	if out, stderr, code := d.corral("volume", "rm", "cli"); code != 0 || out != "cli\n" {
		t.Errorf("corral volume rm: exit %d, %q %s", code, out, stderr)
	}
}

// TestForkVolumes forks a sandbox that mounts a volume on runc and
// gVisor: with share the copy writes into the same volume, with copy it
// writes into a copy of its own that starts with the source's files.
func TestForkVolumes(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, "btrfs", "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testForkVolumes(t, d, rt, "fork-"+rt) })
	}
}

func testForkVolumes(t *testing.T, d *daemon, rt, vol string) {
	ctx := t.Context()
	if _, err := d.Client.CreateVolume(ctx, vol, corral.VolumeOptions{}); err != nil {
		t.Fatal(err)
	}
	src := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/data"}}})
	mustExec(t, d, src.ID, "echo src > /data/f")
	if _, err := d.Client.Fork(ctx, src.ID, 1); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Fatalf("fork without --volumes = %v, want failed_precondition", err)
	}
	shared, err := d.Client.ForkWith(ctx, src.ID, corral.ForkOptions{Count: 1, Volumes: corral.VolumesShare})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, d, shared[0].ID, "cat /data/f && echo shared > /data/from-fork")
	if out, _ := d.execOut(t, src.ID, "cat /data/from-fork"); out != "shared\n" {
		t.Errorf("the source reads the sharing fork's write as %q", out)
	}
	copied, err := d.Client.ForkWith(ctx, src.ID, corral.ForkOptions{Count: 1, Volumes: corral.VolumesCopy})
	if err != nil {
		t.Fatal(err)
	}
	c := copied[0]
	if want := vol + "-" + c.ID; len(c.Mounts) != 1 || c.Mounts[0].Volume != want {
		t.Fatalf("copied fork mounts %+v, want volume %s", c.Mounts, want)
	}
	if out, _ := d.execOut(t, c.ID, "cat /data/f && echo copy > /data/f && cat /data/f"); out != "src\ncopy\n" {
		t.Errorf("the copy reads and writes %q", out)
	}
	if out, _ := d.execOut(t, src.ID, "cat /data/f"); out != "src\n" {
		t.Errorf("the copy's write reached the source's volume: %q", out)
	}
	for _, sb := range []*corral.Sandbox{src, &shared[0], &c} {
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{vol, c.Mounts[0].Volume} {
		if err := d.Client.DeleteVolume(ctx, v); err != nil {
			t.Errorf("deleting %s: %v", v, err)
		}
	}
	checkUnmounted(t, filepath.Join(d.StateDir, "volumes", vol), src.ID)
}

// TestVolumesThroughCrash SIGKILLs the daemon while creates of sandboxes
// that mount a volume, and creates of volumes, are in flight. After the
// restart the volume is there with its file, every sandbox left sees it,
// every volume listed has its files and no volume tree is left without
// a record; once the sandboxes are deleted nothing is mounted.
func TestVolumesThroughCrash(t *testing.T) {
	d := startDaemon(t, "btrfs")
	ctx := t.Context()
	if _, err := d.Client.CreateVolume(ctx, "crash", corral.VolumeOptions{SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.VolumeWriteFile(ctx, "crash", "/hello", strings.NewReader("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
		once sync.Once
	)
	for i := range 6 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = d.Client.CreateVolume(cctx, fmt.Sprintf("v%d", i), corral.VolumeOptions{SizeBytes: 16 << 20})
		}()
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := d.Client.Create(cctx, corral.CreateOptions{Template: "bb", Mounts: []corral.Mount{{Volume: "crash", Target: "/v"}}}); err != nil {
				return
			}
			mu.Lock()
			done++
			n := done
			mu.Unlock()
			if n == 2 {
				once.Do(d.Kill)
			}
		}()
	}
	wg.Wait()
	once.Do(d.Kill)
	d.Start()
	checkVolumesAfterCrash(t, d)
}

// checkVolumesAfterCrash checks what TestVolumesThroughCrash promises of
// the restarted daemon d, and deletes every sandbox and volume.
func checkVolumesAfterCrash(t *testing.T, d *daemon) {
	ctx := t.Context()
	list, err := d.Client.List(ctx, corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 6 sandboxes exist after the restart", len(list))
	for _, sb := range list {
		if out, res := d.execOut(t, sb.ID, "cat /v/hello"); res.ExitCode != 0 || out != "hello\n" {
			t.Errorf("sandbox %s after the restart reads %q (exit %d)", sb.ID, out, res.ExitCode)
		}
	}
	vols, err := d.Client.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if _, err := d.Client.VolumeStat(ctx, v.Name, "/"); err != nil {
			t.Errorf("volume %s is listed but has no files: %v", v.Name, err)
		}
	}
	for _, sb := range list {
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Errorf("deleting %s: %v", sb.ID, err)
		}
	}
	for _, v := range vols {
		if err := d.Client.DeleteVolume(ctx, v.Name); err != nil {
			t.Errorf("deleting volume %s: %v", v.Name, err)
		}
	}
	// What the storage keeps is what was listed: a tree that a killed
	// create left without a record is gone once the daemon has started.
	for _, dir := range []string{filepath.Join(d.StateDir, "storage", "mnt", "volumes"), filepath.Join(d.StateDir, "storage", "volumes")} {
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("volume trees left after deleting every listed volume: %v", names)
		}
	}
	checkUnmounted(t, filepath.Join(d.StateDir, "volumes", "crash"), "")
}

// TestSnapshotVolumes snapshots a sandbox that mounts a volume on runc
// and gVisor: a sandbox from a shared snapshot mounts the volume itself,
// one from a copied snapshot a copy of the volume as it was at the
// snapshot, and the snapshot's copy goes with the snapshot.
func TestSnapshotVolumes(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, "btrfs", "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testSnapshotVolumes(t, d, rt, "snap-"+rt) })
	}
}

func testSnapshotVolumes(t *testing.T, d *daemon, rt, vol string) {
	ctx := t.Context()
	if _, err := d.Client.CreateVolume(ctx, vol, corral.VolumeOptions{}); err != nil {
		t.Fatal(err)
	}
	src := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{{Volume: vol, Target: "/data"}}})
	mustExec(t, d, src.ID, "echo before > /data/f")
	shared, err := d.Client.CreateSnapshotWith(ctx, src.ID, corral.SnapshotOptions{Name: vol + "-s", Volumes: corral.VolumesShare})
	if err != nil {
		t.Fatal(err)
	}
	copied, err := d.Client.CreateSnapshotWith(ctx, src.ID, corral.SnapshotOptions{Name: vol + "-c", Volumes: corral.VolumesCopy})
	if err != nil {
		t.Fatal(err)
	}
	if !copied.VolumesCopied || len(copied.Mounts) != 1 || copied.Mounts[0].Volume != vol+"-"+copied.Name {
		t.Fatalf("copied snapshot %+v", copied)
	}
	mustExec(t, d, src.ID, "echo after > /data/f")
	a := d.create(t, corral.CreateOptions{FromSnapshot: shared.Name})
	if out, _ := d.execOut(t, a.ID, "cat /data/f"); out != "after\n" {
		t.Errorf("a sandbox from the shared snapshot reads %q, want the volume as it is", out)
	}
	b := d.create(t, corral.CreateOptions{FromSnapshot: copied.Name})
	if out, _ := d.execOut(t, b.ID, "cat /data/f && echo mine > /data/f"); out != "before\n" {
		t.Errorf("a sandbox from the copied snapshot reads %q, want the volume at the snapshot", out)
	}
	if out, _ := d.execOut(t, src.ID, "cat /data/f"); out != "after\n" {
		t.Errorf("the copy's write reached the volume: %q", out)
	}
	for _, sb := range []*corral.Sandbox{src, a, b} {
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Client.DeleteVolume(ctx, vol); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Errorf("delete of a volume a snapshot keeps = %v, want failed_precondition", err)
	}
	for _, s := range []string{shared.Name, copied.Name} {
		if err := d.Client.DeleteSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{vol, b.Mounts[0].Volume} {
		if err := d.Client.DeleteVolume(ctx, v); err != nil {
			t.Errorf("deleting %s: %v", v, err)
		}
	}
	if vs, _ := d.Client.Volumes(ctx); len(vs) != 0 {
		t.Errorf("volumes left: %+v", vs)
	}
	checkUnmounted(t, filepath.Join(d.StateDir, "volumes", vol), src.ID)
}
