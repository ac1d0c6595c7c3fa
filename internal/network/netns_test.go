package network

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
)

// TestRunOnOwnThreadRestoresNamespace checks that the thread that entered
// a new namespace is back in the original one afterwards and still alive
// for reuse. A thread left locked would be retired, or, if it were the
// main thread, parked forever inside the sandbox's namespace, keeping it
// and its veth alive.
func TestRunOnOwnThreadRestoresNamespace(t *testing.T) {
	testutil.RequiresRoot(t)
	want, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		var tid int
		var inside string
		err := runOnOwnThread(func() error {
			tid = unix.Gettid()
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return err
			}
			inside, _ = os.Readlink("/proc/thread-self/ns/net")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if inside == want {
			t.Fatal("unshare did not change the namespace")
		}
		got, err := os.Readlink("/proc/self/task/" + strconv.Itoa(tid) + "/ns/net")
		if err != nil {
			t.Fatalf("thread %d is gone: %v", tid, err)
		}
		if got != want {
			t.Fatalf("thread %d left in %s, want %s", tid, got, want)
		}
	}
}
