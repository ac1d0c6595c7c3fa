package mounts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// volume makes a directory outside the allowed root, as storage keeps a
// volume, with one file; both in the stored ID range.
func (e *env) volume(t *testing.T, name string) string {
	t.Helper()
	d := filepath.Join(e.outside, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(d, "hello")
	if err := os.WriteFile(f, []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d, f} {
		if err := os.Chown(p, driver.StoredIDBase, driver.StoredIDBase); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestVolumeIgnoresAllowedRoots(t *testing.T) {
	e := newEnv(t)
	vol := e.volume(t, "data")
	for _, mode := range []sandbox.MountMode{sandbox.MountReadOnly, sandbox.MountReadWrite, sandbox.MountCopyOnWrite} {
		dm := e.prepare(t, "vol-"+string(mode), sandbox.Mount{Volume: "data", Source: vol, Target: "/data", Mode: mode})
		if got := dm[0].ReadOnly; got != (mode == sandbox.MountReadOnly) {
			t.Errorf("%s: ReadOnly = %v", mode, got)
		}
		if b, err := os.ReadFile(filepath.Join(dm[0].Source, "hello")); err != nil || string(b) != "hi\n" {
			t.Errorf("%s: reading through the mount: %q, %v", mode, b, err)
		}
		e.release(t, "vol-"+string(mode))
	}
	// The same path as a host directory is refused: it is no allowed root.
	if err := e.m.Check([]sandbox.Mount{{Source: vol, Target: "/data"}}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("Check of the volume's path as a host directory = %v, want permission_denied", err)
	}
}

func TestVolumeRefusesSymlinkedPath(t *testing.T) {
	e := newEnv(t)
	e.volume(t, "real")
	link := filepath.Join(e.outside, "link")
	if err := os.Symlink("real", link); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Prepare(context.Background(), "vol-link", []sandbox.Mount{{Volume: "v", Source: link, Target: "/v"}}, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot})
	if err == nil || !errors.Is(err, unix.ELOOP) {
		t.Errorf("Prepare of a volume through a symlink = %v, want ELOOP", err)
	}
	e.checkGone(t, "vol-link")
}

func TestVolumeMapsStoredRangeToRoot(t *testing.T) {
	e := newEnv(t)
	vol := e.volume(t, "mapped")
	other := driver.HostIDs{UID: driver.StoredIDBase + driver.StoredIDSize, GID: driver.StoredIDBase + driver.StoredIDSize}
	dm, err := e.m.Prepare(context.Background(), "vol-map", []sandbox.Mount{{Volume: "mapped", Source: vol, Target: "/v"}}, sandbox.MountOptions{Root: other, User: other})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dm[0].Source, "hello"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != other.UID || st.Gid != other.GID {
		t.Errorf("a stored-root file shows as %d:%d, want the sandbox root %d:%d", st.Uid, st.Gid, other.UID, other.GID)
	}
	e.release(t, "vol-map")
}
