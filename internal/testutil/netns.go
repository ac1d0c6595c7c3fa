package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// NewNetNS makes a network namespace owned by host root and bind-mounted
// at dir/netns, as the daemon's network package does, and returns its
// path. It is unmounted when the test ends.
func NewNetNS(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		// The thread stays in the new namespace: it is never unlocked,
		// so the runtime retires it when the goroutine ends.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
	})
	return path
}
