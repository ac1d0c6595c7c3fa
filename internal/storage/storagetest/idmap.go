package storagetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/storage"
)

// testIDMappedRoot checks RootOptions.IDMap: the root shows the stored
// owners as the namespace maps them, writes through it land with stored
// owners on disk, and a 0600 file is readable by the mapped owner through
// the root only, not on disk.
func testIDMappedRoot(t *testing.T, b storage.Backend, caps Capabilities) {
	if !caps.IDMap {
		t.Skip("no Capabilities.IDMap")
	}
	const stored = driver.StoredIDBase
	base := uint32(stored + 5*driver.StoredIDSize)
	err := b.CreateTemplate(t.Context(), "base", func(dir string) error {
		if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("template\n"), 0o600); err != nil {
			return err
		}
		for _, p := range []string{dir, filepath.Join(dir, "secret")} {
			if err := os.Lchown(p, stored, stored); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ns := MappingNS(t, stored, base, driver.StoredIDSize)
	root, err := b.CreateRoot(t.Context(), "mapped", "base", storage.RootOptions{IDMap: ns})
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.DeleteRoot(t.Context(), "mapped") })
	if got := owner(t, filepath.Join(root, "secret")); got != base {
		t.Errorf("template file shows owner %d through the root, want %d", got, base)
	}
	made := filepath.Join(root, "made")
	if err := os.WriteFile(made, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(made, int(base+7), int(base+7)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "secret"), []byte("changed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := readAs(t, base, root, "secret"), "changed\n"; got != want {
		t.Errorf("the mapped owner reads %q through the root, want %q", got, want)
	}
	c, ok := b.(storage.Changes)
	if !ok {
		return
	}
	upper := c.ChangesPath("mapped")
	if got := owner(t, filepath.Join(upper, "made")); got != stored+7 {
		t.Errorf("new file stored with owner %d, want %d", got, stored+7)
	}
	if got := owner(t, filepath.Join(upper, "secret")); got != stored {
		t.Errorf("copied-up file stored with owner %d, want %d", got, stored)
	}
	if got := readAs(t, base, upper, "secret"); got != "" {
		t.Errorf("the mapped owner reads the stored file: %q", got)
	}
}

// MappingNS returns a user namespace that maps from.. to to.. (size IDs)
// and 0 to 0, as storage.RootOptions.IDMap asks.
func MappingNS(t testing.TB, from, to uint32, size int) *os.File {
	t.Helper()
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: int(from), HostID: int(to), Size: size}}
	cmd := exec.Command("true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if werr := cmd.Wait(); err == nil && werr != nil {
		f.Close()
		err = werr
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// readAs reads dir/name as host user and group id, with dir open already
// (so that the directories above it need not be searchable by id), and
// returns what it read, "" if it could not.
func readAs(t *testing.T, id uint32, dir, name string) string {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command("cat", "/proc/self/fd/3/"+name)
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id}}
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func owner(t *testing.T, name string) uint32 {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}
