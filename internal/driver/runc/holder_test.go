package runc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
)

// TestHolderNoexecMountDir: the holder does not live in MountDir, so a
// MountDir on a noexec file system (as /run often is) still works.
func TestHolderNoexecMountDir(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, "mode=0711"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.MountDir, c.UserNamespaces = dir, true })
	if d.holder == nil {
		t.Fatal("no holder program")
	}
	rootfs := testutil.BusyboxRootfs(t)
	if err := d.PrepareTemplate(rootfs); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "noexec", RootFS: rootfs}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(ctx, "noexec")
	if out, err := execOnce(ctx, d, "noexec", "cat /proc/self/uid_map"); err != nil || !strings.Contains(out, strconv.Itoa(idBase)) {
		t.Errorf("uid_map in the sandbox: %q, %v", out, err)
	}
}
