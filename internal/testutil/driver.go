package testutil

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/subreaper"
)

// SubreaperMain runs the tests of m and exits. As root it first makes the
// test process a child subreaper, as the daemon is: sandbox processes
// reparent to it once their runtime exits, and the drivers' reapers reap
// them.
func SubreaperMain(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "setting child subreaper:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// CgroupParent returns a cgroup parent path unique to the test,
// "/corral-test-<random>", and removes it from every hierarchy when the
// test ends (drivers remove the sandboxes' cgroups below it).
func CgroupParent(t testing.TB) string {
	p := fmt.Sprintf("/corral-test-%08x", rand.Uint32())
	t.Cleanup(func() {
		roots, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, r := range append(roots, "/sys/fs/cgroup") {
			_ = os.Remove(filepath.Join(r, p))
		}
	})
	return p
}

// DriverDeps returns what a driver under test needs besides its own
// configuration: a short root directory (unix socket paths are limited to
// 107 bytes) and a running reaper. Both go when the test ends, after the
// cleanups registered later, such as the driver's Close. The root is on
// the /run tmpfs, where the daemon keeps its drivers' roots (its run dir),
// when /run is there.
func DriverDeps(t testing.TB) (root string, rp *subreaper.Reaper) {
	t.Helper()
	dir := "/run/corral-test"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		dir = ""
	}
	root, err := os.MkdirTemp(dir, "crl")
	if err != nil {
		t.Fatal(err)
	}
	rp = subreaper.New(subreaper.Options{})
	rp.Start(context.Background())
	t.Cleanup(func() {
		rp.Close()
		os.RemoveAll(root)
	})
	return root, rp
}
