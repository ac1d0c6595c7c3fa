// Package testutil holds helpers shared by Corral's tests: requirement
// checks that skip locally and fail under CORRAL_TEST_REQUIRE=1, and leak
// checks for host resources.
package testutil

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// Required reports whether missing requirements must fail tests instead of
// skipping them (CI sets CORRAL_TEST_REQUIRE=1).
func Required() bool { return os.Getenv("CORRAL_TEST_REQUIRE") == "1" }

func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("requirement missing (CORRAL_TEST_REQUIRE=1): "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// RequiresRoot skips (or fails in CI) unless the test runs as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "test needs root")
	}
}

// RequiresBinary skips (or fails in CI) unless name is on PATH, and returns
// its path.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, "test needs %s on PATH", name)
	}
	return p
}

// RequiresKVM skips (or fails in CI) unless /dev/kvm can be opened.
func RequiresKVM(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		missing(t, "test needs /dev/kvm: %v", err)
		return
	}
	f.Close()
}

// BusyboxRootfs builds a busybox rootfs in a fresh temporary directory and
// returns its path. It needs busybox-static at /bin/busybox.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	RequiresBinary(t, "busybox")
	dir := t.TempDir()
	if err := fillBusybox(dir); err != nil {
		t.Fatalf("building busybox rootfs: %v", err)
	}
	return dir
}

// WaitFor polls cond until it holds, and fails the test after 5 seconds.
func WaitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a condition")
		}
	}
}
