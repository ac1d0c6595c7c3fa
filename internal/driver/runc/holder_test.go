package runc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
)

// TestInstallHolder checks the holder program: it runs and exits 0, as
// any user, and installing it again keeps a good copy and replaces a bad
// one.
func TestInstallHolder(t *testing.T) {
	if holderProgram() == nil {
		t.Skip("no holder program on this architecture: /proc/self/exe is used")
	}
	dir := t.TempDir()
	// Searchable by every user, as MountDir is (the temporary
	// directory's parent is not).
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	path, err := installHolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, holderName) {
		t.Fatalf("path %s", path)
	}
	// It makes a user namespace and exits 0.
	if out, err := exec.Command(path).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("running the holder: %v, output %q", err, out)
	}
	// As the owner of a sandbox's namespace would.
	if os.Geteuid() == 0 {
		if err := asHostID(ownerID(7), func() error { return exec.Command(path).Run() }); err != nil {
			t.Fatalf("running the holder as host user %d: %v", ownerID(7), err)
		}
	}
	fi, _ := os.Stat(path)
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := installHolder(dir); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(path).Run(); err != nil {
		t.Fatalf("the replaced holder: %v", err)
	}
	again, _ := os.Stat(path)
	if _, err := installHolder(dir); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Stat(path); !os.SameFile(now, again) || again.Mode() != fi.Mode() || fi.Mode().Perm() != 0o755 {
		t.Errorf("a good holder was replaced, or the mode changed: %v %v", fi.Mode(), again.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left in the directory: %v", entries)
	}
}

// TestNewUserNS makes a namespace the way Create does and checks its owner
// and ID map, and that Close reaps the holder.
func TestNewUserNS(t *testing.T) {
	holder := installTestHolder(t)
	// The fallback re-executes this test binary, which refuses the
	// argument and exits: as good a holder.
	for name, h := range map[string]string{"program": holder, "reexec": ""} {
		t.Run(name, func(t *testing.T) { testNewUserNS(t, h) })
	}
	// The daemon's own namespace is refused as a holder's.
	if err := checkNewUserNS("/proc/self/ns/user"); err == nil {
		t.Error("checkNewUserNS accepted the daemon's own namespace")
	}
}

func testNewUserNS(t *testing.T, holder string) {
	ns, err := newUserNS(holder, ownerID(7))
	if err != nil {
		t.Fatal(err)
	}
	pid := ns.cmd.Process.Pid
	if err := checkNewUserNS(ns.Path); err != nil {
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
	holder := installTestHolder(b)
	for name, h := range map[string]string{"program": holder, "reexec": ""} {
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

// installTestHolder installs the holder program in a directory that every
// user can search, as MountDir is.
func installTestHolder(t testing.TB) string {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := installHolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return holder
}
