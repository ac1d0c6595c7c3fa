package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corralrun/corral/sdk"
)

// TestMountsCopyOnWriteCounted writes past a sandbox's disk limit through
// a cow mount on btrfs: the layer lies in the root's subvolume, so the
// write fails with EDQUOT, and the host directory is untouched.
func TestMountsCopyOnWriteCounted(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(allowed, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "btrfs", "--allow-mount", allowed)
	sb := d.create(t, corral.CreateOptions{DiskMB: 16, Mounts: []corral.Mount{{Source: allowed, Target: "/cow", Mode: corral.MountCopyOnWrite}}})
	out, res := d.execOut(t, sb.ID, "dd if=/dev/zero of=/cow/big bs=1M count=64 2>&1")
	if res.ExitCode == 0 || !strings.Contains(out, "quota") {
		t.Errorf("writing 64 MiB through a cow mount of a sandbox limited to 16: exit %d, %q; want a disk quota error", res.ExitCode, out)
	}
	if _, err := os.Stat(filepath.Join(allowed, "big")); !os.IsNotExist(err) {
		t.Errorf("the write reached the host directory: %v", err)
	}
	if err := d.Client.Delete(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	checkUnmounted(t, allowed, "")
}
