package daemon

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// A storage backend that fails to open fails Start with its own error,
// and the shutdown that follows does not trip over a backend that was
// never opened.
func TestStartWithStorageThatFailsToOpen(t *testing.T) {
	testutil.RequiresRoot(t)
	state := t.TempDir()
	_, err := Start(t.Context(), Config{StateDir: state, RunDir: filepath.Join(state, "run"),
		Socket: filepath.Join(state, "corral.sock"), Storage: "btrfs", BtrfsQuotaMode: "exact",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Start with an unknown quota mode: %v, want ErrInvalidArgument", err)
	}
}

// A start that fails at its last step, serving the E2B API, releases all
// that the steps before it took: the locks, the socket, the run dir, the
// network objects and every mount.
func TestFailedStartReleasesEverything(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	state := t.TempDir()
	run := filepath.Join(state, "run")
	socket := filepath.Join(state, "corral.sock")
	netw := testutil.NewDaemonNetwork(t)
	_, err = Start(t.Context(), Config{StateDir: state, RunDir: run, Socket: socket, Storage: "overlay",
		Runtimes: []string{"runc"}, CgroupParent: "/corral-daemon-test-" + filepath.Base(state),
		NetworkSubnet: netw.Subnet, NetworkPrefix: netw.Prefix, NetworkTable: netw.Table,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		APIKey:       "key", E2BListen: taken.Addr().String(),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err == nil || !strings.Contains(err.Error(), "E2B API") {
		t.Fatalf("Start with the E2B address taken: %v, want its listen error", err)
	}
	lock, err := lockDir(state)
	if err != nil {
		t.Fatalf("the state dir is still locked: %v", err)
	}
	lock.Close()
	for _, p := range []string{socket, run} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
	if m := testutil.Mounts(t, state); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if left := netw.Leftovers(t); len(left) > 0 {
		t.Errorf("network objects left: %v", left)
	}
}
