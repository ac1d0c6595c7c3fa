package runc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/overlay"
	"github.com/corralrun/corral/internal/testutil"
)

// rangedRoots makes an overlay storage with one busybox template that d
// prepared.
func rangedRoots(t *testing.T, d *Driver) *overlay.Backend {
	t.Helper()
	b, err := overlay.New(t.Context(), overlay.Config{Dir: filepath.Join(t.TempDir(), "storage")})
	if err != nil {
		t.Fatal(err)
	}
	src := testutil.BusyboxRootfs(t)
	err = b.CreateTemplate(t.Context(), "base", func(dir string) error {
		if err := snapshotdir.CopyTree(t.Context(), src, dir); err != nil {
			return err
		}
		return d.PrepareTemplate(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// rangedRoot reserves IDs for sandbox id and makes its root on b as the
// Manager does.
func rangedRoot(t *testing.T, d *Driver, b *overlay.Backend, id string) string {
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
	t.Cleanup(func() { b.DeleteRoot(t.Context(), id) })
	return root
}

// TestIDRanges: two sandboxes with reserved IDs run in ranges of their
// own, their roots show those ranges while the disk keeps the stored one,
// and what sandbox root writes is stored as the stored range's root.
func TestIDRanges(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	b := rangedRoots(t, d)
	ctx := t.Context()
	maps := map[string]string{}
	for _, id := range []string{"ra", "rb"} {
		root := rangedRoot(t, d, b, id)
		ids, err := d.RootOwner(root)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rangeSlot(ids.UID); !ok {
			t.Fatalf("root of %s is owned by %d, not a slot's range", id, ids.UID)
		}
		if err := d.Create(ctx, driver.Spec{ID: id, RootFS: root}); err != nil {
			t.Fatal(err)
		}
		out, err := execOnce(ctx, d, id, "cat /proc/self/uid_map; echo secret > /root-only; chmod 600 /root-only")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Join(strings.Fields(out), " "), fmt.Sprintf("0 %d %d", ids.UID, idRange); got != want {
			t.Errorf("uid_map of %s %q, want %q", id, got, want)
		}
		maps[id] = out
		if owner := fileOwner(t, filepath.Join(root, "root-only")); owner != ids.UID {
			t.Errorf("file of %s shows owner %d through the root, want %d", id, owner, ids.UID)
		}
		if owner := fileOwner(t, filepath.Join(b.ChangesPath(id), "root-only")); owner != idBase {
			t.Errorf("file of %s stored with owner %d, want %d", id, owner, idBase)
		}
	}
	if maps["ra"] == maps["rb"] {
		t.Errorf("both sandboxes run with uid_map %q", maps["ra"])
	}
	for _, id := range []string{"ra", "rb"} {
		if err := d.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(d.dir(id)); !os.IsNotExist(err) {
			t.Errorf("sandbox directory of %s left: %v", id, err)
		}
	}
	if got := slotsOwnedBy(t, d, d.cfg.Root); len(got) != 0 {
		t.Errorf("slots left: %v", got)
	}
}

// TestReserveIDsThenDelete: a reservation that never gets a Create is
// freed by Delete.
func TestReserveIDsThenDelete(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	b := rangedRoots(t, d)
	ns, err := d.ReserveIDs(t.Context(), "unused", b.TemplatePath("base"))
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	if err := d.Delete(t.Context(), "unused"); err != nil {
		t.Fatal(err)
	}
	if got := slotsOwnedBy(t, d, d.cfg.Root); len(got) != 0 {
		t.Errorf("slots left: %v", got)
	}
	if d.reserved.take("unused") != nil {
		t.Error("reserved namespace kept after Delete")
	}
}
