package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/overlay"
	"github.com/corralrun/corral/internal/testutil"
)

// rangedEnv is a gVisor driver lending its slots from a runc driver's
// table, as the daemon sets them up, and an overlay storage with one
// busybox template that both prepared.
func rangedEnv(t *testing.T, e env) (*Driver, *overlay.Backend) {
	t.Helper()
	testutil.RequiresBinary(t, "runc")
	rd, err := runc.New(runc.Config{Root: t.TempDir(), AgentPath: e.agent, UserNamespaces: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	d := e.newDriver(t, func(c *Config) { c.IDSlots = rd.IDSlots() })
	b, err := overlay.New(t.Context(), overlay.Config{Dir: filepath.Join(t.TempDir(), "storage")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	src := e.rootfs(t)
	err = b.CreateTemplate(t.Context(), "base", func(dir string) error {
		if err := snapshotdir.CopyTree(t.Context(), src, dir); err != nil {
			return err
		}
		if err := rd.PrepareTemplate(dir); err != nil {
			return err
		}
		return d.PrepareTemplate(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, b
}

// rangedRoot reserves IDs for sandbox id and makes its root on b as the
// Manager does; it returns the root and the host uid its root runs as.
func rangedRoot(t *testing.T, d *Driver, b *overlay.Backend, id string) (string, uint32) {
	t.Helper()
	ns, err := d.ReserveIDs(t.Context(), id, b.TemplatePath("base"))
	if err != nil || ns == nil {
		t.Fatalf("reserving IDs: %v, %v", ns, err)
	}
	root, err := b.CreateRoot(t.Context(), id, "base", storage.RootOptions{IDMap: ns})
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: a sandbox a failed test left on the root
	// goes before the root. t.Context is done by then.
	t.Cleanup(func() { b.DeleteRoot(context.Background(), id) })
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	ids, err := d.RootOwner(root)
	if err != nil {
		t.Fatal(err)
	}
	if ids.UID <= driver.StoredIDBase {
		t.Fatalf("root of %s runs as %d, not a range of its own", id, ids.UID)
	}
	return root, ids.UID
}

// hostUIDMaps returns the uid_map(5) lines, as the host sees them, of
// sandbox id's Sentry and gofer.
func hostUIDMaps(t *testing.T, d *Driver, id string) []string {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(d.dir(id), pidFile))))
	if err != nil {
		t.Fatal(err)
	}
	var maps []string
	for _, p := range []int{pid, d.goferPid(id)} {
		maps = append(maps, strings.Join(strings.Fields(readFile(t, fmt.Sprintf("/proc/%d/uid_map", p))), " "))
	}
	return maps
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestIDRanges: two sandboxes with reserved IDs run, Sentry and gofer
// alike, in host ranges of their own, which a runc driver's table handed
// out; a file that sandbox root writes is stored as the stored range's
// root; Delete frees the slots.
func TestIDRanges(t *testing.T) {
	e := newEnv(t)
	d, b := rangedEnv(t, e)
	ctx := t.Context()
	for _, id := range []string{"ga", "gb"} {
		root, uid := rangedRoot(t, d, b, id)
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: root}); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("0 %d %d", uid, driver.StoredIDSize)
		for i, m := range hostUIDMaps(t, d, id) {
			if m != want {
				t.Errorf("uid_map of %s's process %d: %q, want %q", id, i, m, want)
			}
		}
		if _, err := drivertest.ExecOnce(ctx, d, id, "echo secret > /root-only; chmod 600 /root-only"); err != nil {
			t.Fatal(err)
		}
		if owner := fileUID(t, filepath.Join(root, "root-only")); owner != uid {
			t.Errorf("file of %s shows owner %d through the root, want %d", id, owner, uid)
		}
		if owner := fileUID(t, filepath.Join(b.ChangesPath(id), "root-only")); owner != driver.StoredIDBase {
			t.Errorf("file of %s stored with owner %d, want %d", id, owner, uint32(driver.StoredIDBase))
		}
	}
	if a, b := hostUIDMaps(t, d, "ga")[0], hostUIDMaps(t, d, "gb")[0]; a == b {
		t.Errorf("both sandboxes run with uid_map %q", a)
	}
	for _, id := range []string{"ga", "gb"} {
		if err := d.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(d.idsDir(id)); !os.IsNotExist(err) {
			t.Errorf("slot record of %s left: %v", id, err)
		}
	}
	checkNothingLeft(t, d, e)
}

func fileUID(t *testing.T, p string) uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// TestRestoreIDRange: a checkpoint of a sandbox in one range restores
// into a sandbox in another (runsc would refuse the changed uid mapping
// without --restore-spec-validation=warning), which then runs, Sentry and
// gofer, in its own range, with the checkpointed memory and a root that
// its root can write.
func TestRestoreIDRange(t *testing.T) {
	e := newEnv(t)
	d, b := rangedEnv(t, e)
	ctx := t.Context()
	root, _ := rangedRoot(t, d, b, "ra")
	if err := d.Create(ctx, driver.Spec{ID: "ra", RootFS: root}); err != nil {
		t.Fatal(err)
	}
	if _, err := drivertest.ExecOnce(ctx, d, "ra", "echo before > /tmp/f"); err != nil {
		t.Fatal(err)
	}
	image := t.TempDir()
	if err := d.Checkpoint(ctx, "ra", image, true); err != nil {
		t.Fatal(err)
	}
	croot, cuid := rangedRoot(t, d, b, "rb")
	if err := d.Restore(ctx, "rb", driver.Spec{RootFS: croot}, image); err != nil {
		t.Fatalf("restoring into another range: %v", err)
	}
	if out, err := drivertest.ExecOnce(ctx, d, "rb", "cat /tmp/f; echo x > /root/g && id -u"); err != nil || out != "before\n0\n" {
		t.Errorf("exec in the restored sandbox: %q, %v", out, err)
	}
	if owner := fileUID(t, filepath.Join(croot, "root", "g")); owner != cuid {
		t.Errorf("file written after the restore shows owner %d, want %d", owner, cuid)
	}
	want := fmt.Sprintf("0 %d %d", cuid, driver.StoredIDSize)
	if m := hostUIDMaps(t, d, "rb"); m[0] != want || m[1] != want {
		t.Errorf("restored sandbox runs with uid_maps %q, want %q", m, want)
	}
	for _, id := range []string{"ra", "rb"} {
		if err := d.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	checkNothingLeft(t, d, e)
}

// TestSweepIDs: a reservation left without a sandbox (a daemon died
// before Create) is freed by the next driver on the same Root; one with
// a sandbox stays.
func TestSweepIDs(t *testing.T) {
	e := newEnv(t)
	d, b := rangedEnv(t, e)
	ctx := t.Context()
	root, _ := rangedRoot(t, d, b, "kept")
	if err := d.Create(ctx, driver.Spec{ID: "kept", RootFS: root}); err != nil {
		t.Fatal(err)
	}
	ns, err := d.ReserveIDs(ctx, "orphan", b.TemplatePath("base"))
	if err != nil || ns == nil {
		t.Fatalf("reserving IDs: %v, %v", ns, err)
	}
	ns.Close()
	d.Close()
	d2, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := os.Stat(d2.idsDir("orphan")); !os.IsNotExist(err) {
		t.Errorf("orphaned reservation kept: %v", err)
	}
	if _, err := os.Stat(d2.idsDir("kept")); err != nil {
		t.Errorf("reservation of a sandbox dropped: %v", err)
	}
	if err := d2.Delete(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, d2, e)
}
