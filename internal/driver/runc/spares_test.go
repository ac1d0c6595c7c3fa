package runc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/driver"
)

// slotsOwnedBy lists the slots in d's mount dir whose owner link names a
// path under dir.
func slotsOwnedBy(t *testing.T, d *Driver, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(d.mountDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		owner, err := os.Readlink(filepath.Join(d.mountDir, e.Name(), "owner"))
		if err == nil && strings.HasPrefix(owner, dir+"/") {
			out = append(out, e.Name()+" -> "+owner)
		}
	}
	return out
}

// TestUserNSSpares: Create takes a spare slot and namespace, the sandbox
// works in it and owns the slot, and Close frees the spares left.
func TestUserNSSpares(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces, c.UserNSSpares = true, 2 })
	b := rangedRoots(t, d)
	d.spares.refill.Run()
	if got := slotsOwnedBy(t, d, d.sparesDir()); len(got) != 2 {
		t.Fatalf("spare slots %v, want 2", got)
	}
	d.spares.mu.Lock()
	taken := d.spares.ready[len(d.spares.ready)-1]
	d.spares.mu.Unlock()

	ctx := t.Context()
	rootfs := rangedRoot(t, d, b, "spare")
	if err := d.Create(ctx, driver.Spec{ID: "spare", RootFS: rootfs}); err != nil {
		t.Fatal(err)
	}
	if owner, err := os.Readlink(filepath.Join(d.slotDir(taken.slot), "owner")); err != nil || owner != d.dir("spare") {
		t.Errorf("slot %d owner %q, %v; want the sandbox's directory", taken.slot, owner, err)
	}
	if _, err := os.Stat(taken.marker); !os.IsNotExist(err) {
		t.Errorf("marker %s still there: %v", taken.marker, err)
	}
	if out, err := execOnce(ctx, d, "spare", "cat /proc/self/uid_map"); err != nil || !strings.Contains(out, strconv.Itoa(int(rangeBase(taken.slot)))) {
		t.Errorf("uid_map in the sandbox: %q, %v", out, err)
	}
	if err := d.Delete(ctx, "spare"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.slotDir(taken.slot)); !os.IsNotExist(err) {
		t.Errorf("slot %d left after Delete: %v", taken.slot, err)
	}
	d.Close()
	if got := slotsOwnedBy(t, d, d.cfg.Root); len(got) != 0 {
		t.Errorf("slots left after Close: %v", got)
	}
}

// crashSpares does to d's ready spares what a daemon crash does: their
// holders die, nothing else is undone. It returns the spares.
func crashSpares(d *Driver) []nsSpare {
	d.spares.mu.Lock()
	defer d.spares.mu.Unlock()
	spares := d.spares.ready
	for _, sp := range spares {
		sp.ns.Close()
	}
	d.spares.ready = nil
	return spares
}

// restarted is a new driver on d's root, as after a crash of d's daemon.
func restarted(t *testing.T, d *Driver) *Driver {
	t.Helper()
	second, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	return second
}

// TestUserNSSparesAfterCrash: a driver killed with spares made leaves
// slots whose markers the next driver on the same root removes, and its
// sweep frees them.
func TestUserNSSparesAfterCrash(t *testing.T) {
	e := newEnv(t)
	first := e.newDriver(t, func(c *Config) { c.UserNamespaces, c.UserNSSpares = true, 2 })
	first.spares.refill.Run()
	if got := slotsOwnedBy(t, first, first.sparesDir()); len(got) != 2 {
		t.Fatalf("spare slots %v, want 2", got)
	}
	crashSpares(first)
	second := restarted(t, first)
	if got := slotsOwnedBy(t, second, first.cfg.Root); len(got) != 0 {
		t.Errorf("slots of the crashed driver's spares left: %v", got)
	}
}

// TestSpareClaimInterrupted: a crash between the two steps of taking a
// spare (claimSlot) leaves the sandbox directory naming the slot while the
// slot still belongs to the spare's marker. The next driver on the root
// frees the slot, and a Delete of the half-made sandbox succeeds and
// leaves no slot behind.
func TestSpareClaimInterrupted(t *testing.T) {
	e := newEnv(t)
	first := e.newDriver(t, func(c *Config) { c.UserNamespaces, c.UserNSSpares = true, 1 })
	first.spares.refill.Run()
	spares := crashSpares(first)
	if len(spares) != 1 {
		t.Fatalf("%d spares, want 1", len(spares))
	}
	sp := spares[0]
	dir := first.dir("half")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sp.mnt, filepath.Join(dir, rootfsLink)); err != nil {
		t.Fatal(err)
	}

	second := restarted(t, first)
	if got := slotsOwnedBy(t, second, first.cfg.Root); len(got) != 0 {
		t.Errorf("slots left after the restart: %v", got)
	}
	if err := second.Delete(t.Context(), "half"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox directory after Delete: %v", err)
	}
	if got := slotsOwnedBy(t, second, first.cfg.Root); len(got) != 0 {
		t.Errorf("slots left after Delete: %v", got)
	}
}
