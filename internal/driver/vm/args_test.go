package vm

import (
	"flag"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/vmguest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestQEMUArgs checks QEMU's command line against golden files, one
// argument a line.
func TestQEMUArgs(t *testing.T) {
	tests := []struct {
		name  string
		accel string
		tsc   int64
		spec  driver.Spec
		net   *vmguest.Network
	}{
		{"tcg-defaults", "tcg", 2096014, driver.Spec{ID: "sb1"}, nil},
		{"tcg-limits", "tcg", 0, driver.Spec{ID: "sb2", Hostname: "box",
			Resources: driver.Resources{MilliCPUs: 1500, MemoryBytes: 256 << 20, Pids: 128}}, nil},
		{"kvm", "kvm", 0, driver.Spec{ID: "sb3", Resources: driver.Resources{MemoryBytes: 1 << 30}}, nil},
		{"network", "tcg", 0, driver.Spec{ID: "sb4"}, &vmguest.Network{Addr: netip.MustParsePrefix("10.200.0.6/30"),
			Gateway: netip.MustParseAddr("10.200.0.5"), MTU: 1500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Driver{
				cfg:      withDefaults(Config{Root: "/state/vm"}),
				kernel:   Kernel{Version: "6.1.0-57-cloud-amd64", Image: "/kernels/boot/vmlinuz-6.1.0-57-cloud-amd64"},
				initrd:   "/state/vm/cache/initramfs-0123456789abcdef01234567.cpio",
				accel:    tt.accel,
				tscKHz:   tt.tsc,
				hostCPUs: 4,
			}
			got := strings.Join(d.qemuArgs(tt.spec.ID, tt.spec, tt.net), "\n") + "\n"
			testutil.CheckGolden(t, filepath.Join("testdata", tt.name+".args"), []byte(got), *update)
		})
	}
}

func TestCPUs(t *testing.T) {
	for _, tt := range []struct {
		milli int64
		want  int
	}{{0, 1}, {1, 1}, {1000, 1}, {1001, 2}, {64000, 4}} {
		if got := cpus(driver.Resources{MilliCPUs: tt.milli}, 4); got != tt.want {
			t.Errorf("cpus(%d) = %d, want %d", tt.milli, got, tt.want)
		}
	}
}
