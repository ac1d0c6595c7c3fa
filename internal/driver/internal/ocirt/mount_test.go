package ocirt

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
)

func TestLockedOptions(t *testing.T) {
	testutil.RequiresRoot(t)
	tests := []struct {
		name  string
		flags uintptr
		want  []string
	}{
		{"relatime", unix.MS_RELATIME, nil},
		{"ro noexec noatime", unix.MS_RDONLY | unix.MS_NOEXEC | unix.MS_NOATIME, []string{"ro", "noexec", "noatime"}},
		{"strictatime nodiratime", unix.MS_STRICTATIME | unix.MS_NODIRATIME, []string{"strictatime", "nodiratime"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := unix.Mount("tmpfs", dir, "tmpfs", tt.flags, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			got, err := LockedOptions(dir)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("LockedOptions (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := LockedOptions(t.TempDir() + "/missing"); err == nil {
		t.Error("LockedOptions of a missing path succeeded")
	}
}
