package ocirt

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetNS runs f on a locked OS thread that has joined the network
// namespace at path; processes f starts begin in that namespace. The
// thread is returned to the daemon's namespace afterwards, or retired by
// the runtime if that fails.
func InNetNS(path string, f func() error) error {
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("opening current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("joining network namespace %s: %w", path, err)
			return
		}
		err = f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
