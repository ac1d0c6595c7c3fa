package userns

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
)

// testOwner and testMap are a namespace owner and ID map of the kind the
// runc driver uses: an unprivileged host user, and 65536 IDs from 2^31.
const (
	testOwner = 1<<31 + 1<<16 + 7
	testMap   = "0 2147483648 65536\n"
)

// TestHolderProgram checks the holder program: it runs from its sealed
// memfd and exits 0, as any user, and nobody can change it.
func TestHolderProgram(t *testing.T) {
	h := openTestHolder(t)
	holder := h.prog
	if out, err := holderCommand(holder).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("running the holder: %v, output %q", err, out)
	}
	// As the owner of a sandbox's namespace would.
	if err := AsHostID(testOwner, holderCommand(holder).Run); err != nil {
		t.Fatalf("running the holder as host user %d: %v", testOwner, err)
	}
	if _, err := holder.WriteAt([]byte{0x90}, 120); err == nil {
		t.Error("the holder's memfd took a write")
	}
}

// TestNewUserNS makes a namespace the way the runc driver does and checks its owner
// and ID map, and that Close reaps the holder.
func TestNewUserNS(t *testing.T) {
	holder := openTestHolder(t)
	// The fallback re-executes this test binary, which refuses the
	// argument and exits: as good a holder.
	for name, h := range map[string]*Holder{"program": holder, "reexec": nil} {
		t.Run(name, func(t *testing.T) { testNewUserNS(t, h) })
	}
	// The daemon's own namespace is refused as a holder's, with the
	// holder's errno.
	if err := checkNew("/proc/self/ns/user", int(unix.ENOSPC)); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("checkNew of the daemon's own namespace: %v, want ENOSPC", err)
	}
}

func testNewUserNS(t *testing.T, h *Holder) {
	ns, err := h.New(testOwner, testMap, testMap)
	if err != nil {
		t.Fatal(err)
	}
	pid := ns.cmd.Process.Pid
	if err := checkNew(ns.Path, 0); err != nil {
		t.Error(err)
	}
	const nsGetOwnerUID = 0xb704 // _IO(0xb7, 0x4)
	var owner uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(ns.Fd), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	if owner != testOwner {
		t.Errorf("owner %d, want %d", owner, testOwner)
	}
	m, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "uid_map"))
	if want := strings.TrimSpace(testMap); err != nil || strings.Join(strings.Fields(string(m)), " ") != want {
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
	for name, h := range map[string]*Holder{"program": holder, "reexec": nil} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				ns, err := h.New(testOwner, testMap, testMap)
				if err != nil {
					b.Fatal(err)
				}
				ns.Close()
			}
		})
	}
}

// openTestHolder opens the holder program, which the test closes.
func openTestHolder(t testing.TB) *Holder {
	t.Helper()
	testutil.RequiresRoot(t)
	if holderProgram() == nil {
		t.Skip("no holder program on this architecture")
	}
	holder, err := OpenHolder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	return holder
}
