package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
)

// TestHolderProgram checks the holder program: it runs from its sealed
// memfd and exits 0, as any user, and nobody can change it.
func TestHolderProgram(t *testing.T) {
	holder := openTestHolder(t)
	if out, err := holderCommand(holder).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("running the holder: %v, output %q", err, out)
	}
	// As the owner of a sandbox's namespace would.
	if err := asHostID(ownerID(7), holderCommand(holder).Run); err != nil {
		t.Fatalf("running the holder as host user %d: %v", ownerID(7), err)
	}
	if _, err := holder.WriteAt([]byte{0x90}, 120); err == nil {
		t.Error("the holder's memfd took a write")
	}
}

// TestHolderNoexecMountDir: the holder does not live in MountDir, so a
// MountDir on a noexec file system (as /run often is) still works.
func TestHolderNoexecMountDir(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, "mode=0711"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.MountDir, c.UserNamespaces = dir, true })
	if d.holder == nil {
		t.Fatal("no holder program")
	}
	rootfs := testutil.BusyboxRootfs(t)
	if err := d.PrepareTemplate(rootfs); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "noexec", RootFS: rootfs}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(ctx, "noexec")
	if out, err := execOnce(ctx, d, "noexec", "cat /proc/self/uid_map"); err != nil || !strings.Contains(out, strconv.Itoa(idBase)) {
		t.Errorf("uid_map in the sandbox: %q, %v", out, err)
	}
}

// TestNewUserNS makes a namespace the way Create does and checks its owner
// and ID map, and that Close reaps the holder.
func TestNewUserNS(t *testing.T) {
	holder := openTestHolder(t)
	// The fallback re-executes this test binary, which refuses the
	// argument and exits: as good a holder.
	for name, h := range map[string]*os.File{"program": holder, "reexec": nil} {
		t.Run(name, func(t *testing.T) { testNewUserNS(t, h) })
	}
	// The daemon's own namespace is refused as a holder's, with the
	// holder's errno.
	if err := checkNewUserNS("/proc/self/ns/user", int(unix.ENOSPC)); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("checkNewUserNS of the daemon's own namespace: %v, want ENOSPC", err)
	}
}

func testNewUserNS(t *testing.T, holder *os.File) {
	ns, err := newUserNS(holder, ownerID(7))
	if err != nil {
		t.Fatal(err)
	}
	pid := ns.cmd.Process.Pid
	if err := checkNewUserNS(ns.Path, 0); err != nil {
		t.Error(err)
	}
	const nsGetOwnerUID = 0xb704 // _IO(0xb7, 0x4)
	var owner uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(ns.Fd), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	if owner != ownerID(7) {
		t.Errorf("owner %d, want %d", owner, ownerID(7))
	}
	m, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "uid_map"))
	if want := fmt.Sprintf("%d %d %d", 0, idBase, idRange); err != nil || strings.Join(strings.Fields(string(m)), " ") != want {
		t.Errorf("uid_map %q, %v; want %s", m, err, want)
	}
	ns.Close()
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
		t.Errorf("holder %d not reaped", pid)
	}
}

// BenchmarkNewUserNS makes and closes user namespaces with the holder
// program, and with the fallback that re-executes this (test) binary.
func BenchmarkNewUserNS(b *testing.B) {
	holder := openTestHolder(b)
	for name, h := range map[string]*os.File{"program": holder, "reexec": nil} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				ns, err := newUserNS(h, ownerID(7))
				if err != nil {
					b.Fatal(err)
				}
				ns.Close()
			}
		})
	}
}

// openTestHolder opens the holder program, which the test closes.
func openTestHolder(t testing.TB) *os.File {
	t.Helper()
	testutil.RequiresRoot(t)
	if holderProgram() == nil {
		t.Skip("no holder program on this architecture")
	}
	holder, err := openHolder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	return holder
}
