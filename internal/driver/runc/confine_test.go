package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/testutil"
)

// TestConfinement checks, from inside a sandbox, what the spec promises:
// the capability set, no_new_privs, the seccomp filter, the rlimits, a
// loopback interface that is up without CAP_NET_ADMIN, and with user
// namespaces a mapped root that owns the sandbox's files and a namespace
// owned by a host user of its own.
func TestConfinement(t *testing.T) {
	e := newEnv(t)
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			d := e.newDriver(t, func(c *Config) { c.UserNamespaces = userns; c.OpenFiles = 1234 })
			ctx := t.Context()
			rootfs := testutil.BusyboxRootfs(t)
			if err := d.PrepareTemplate(rootfs); err != nil {
				t.Fatal(err)
			}
			if err := d.Create(ctx, driver.Spec{ID: "conf", RootFS: rootfs}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Delete(context.Background(), "conf") })
			if userns {
				// No session keyring charged to the host user that every
				// sandbox's root maps to: the kernel allows a user 200 keys,
				// so one keyring per sandbox stopped the 201st.
				users, err := os.ReadFile("/proc/key-users")
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(string(users), "\n") {
					if f := strings.Fields(line); len(f) > 0 && f[0] == strconv.Itoa(idBase)+":" {
						t.Errorf("the sandbox's root (host uid %d) owns keys: %s", idBase, line)
					}
				}
			}
			status, err := execOnce(ctx, d, "conf", "cat /proc/self/status")
			if err != nil {
				t.Fatal(err)
			}
			fields := map[string]string{}
			for _, line := range strings.Split(status, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok {
					fields[k] = strings.TrimSpace(v)
				}
			}
			// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5,
			// SETGID 6, SETUID 7, NET_BIND_SERVICE 10.
			const wantCaps = "00000000000004fb"
			for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
				if fields[k] != wantCaps {
					t.Errorf("%s = %s, want %s", k, fields[k], wantCaps)
				}
			}
			if fields["CapInh"] != "0000000000000000" || fields["CapAmb"] != "0000000000000000" {
				t.Errorf("inheritable %s ambient %s, want none", fields["CapInh"], fields["CapAmb"])
			}
			if runtime.GOARCH == "amd64" {
				cmdline, err := execOnce(ctx, d, "conf", "tr '\\0' ' ' </proc/1/cmdline")
				if err != nil || !strings.Contains(cmdline, " --seccomp=") {
					t.Errorf("the agent was not given the filter to install: %q, %v", cmdline, err)
				}
			}
			// One filter: the agent's, or runc's where Corral cannot
			// compile the profile; never both.
			if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" || fields["Seccomp_filters"] != "1" {
				t.Errorf("NoNewPrivs %s Seccomp %s Seccomp_filters %s, want 1, 2 and 1", fields["NoNewPrivs"], fields["Seccomp"], fields["Seccomp_filters"])
			}
			out, err := execOnce(ctx, d, "conf", "ulimit -n; ulimit -Hn; ulimit -c; cat /sys/class/net/lo/operstate; cat /proc/self/oom_score_adj")
			if err != nil {
				t.Fatal(err)
			}
			// operstate of lo is "unknown" when up (it has no carrier), "down" otherwise.
			if want := "1234\n1234\n0\nunknown\n500\n"; out != want {
				t.Errorf("limits and lo state = %q, want %q", out, want)
			}
			// The agent is not dumpable: its descriptors (its log on the
			// host above all) and environment are out of reach.
			out, err = execOnce(ctx, d, "conf", "echo x >> /proc/1/fd/2 && echo wrote; cat /proc/1/fd/2 >/dev/null && echo opened; cat /proc/1/environ >/dev/null && echo read; true")
			if err != nil || out != "" {
				t.Errorf("the agent's descriptors or environment from inside: %q, %v", out, err)
			}
			out, err = execOnce(ctx, d, "conf", "cat /proc/self/uid_map; echo x > /made-inside; stat -c '%u %g' / /made-inside")
			if err != nil {
				t.Fatal(err)
			}
			if userns {
				f := strings.Fields(out)
				if len(f) < 7 || f[0] != "0" || f[2] != "65536" {
					t.Fatalf("uid_map and owners = %q", out)
				}
				host, _ := strconv.ParseUint(f[1], 10, 32)
				if host != idBase {
					t.Errorf("sandbox root is host uid %d, want %d", host, idBase)
				}
				// The root directory and a file made by sandbox root
				// look owned by root inside and by idBase outside.
				if strings.Join(f[3:], " ") != "0 0 0 0" {
					t.Errorf("owners inside = %q, want root", strings.Join(f[3:], " "))
				}
				if owner := fileOwner(t, filepath.Join(rootfs, "made-inside")); owner != idBase {
					t.Errorf("file made by sandbox root is owned by %d on disk, want %d", owner, idBase)
				}
				if _, err := os.Lstat(filepath.Join(d.dir("conf"), rootfsLink)); err != nil {
					t.Errorf("no slot link: %v", err)
				}
				// The namespace is owned by the sandbox's root, not by
				// host root: per-user kernel counters are its own.
				pid, err := ocirt.ReadPid(filepath.Join(d.dir("conf"), pidFile))
				if err != nil {
					t.Fatal(err)
				}
				nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
				if err != nil {
					t.Fatal(err)
				}
				nsOwner, err := unix.IoctlGetUint32(int(nsf.Fd()), unix.NS_GET_OWNER_UID)
				nsf.Close()
				if err != nil || nsOwner < ownerBase || nsOwner >= ownerBase+idSlots {
					t.Errorf("user namespace owner = %d, %v; want one of the slot owners", nsOwner, err)
				}
			} else if !strings.HasPrefix(out, "         0          0 4294967295") {
				t.Errorf("uid_map without user namespace = %q", out)
			}
			if err := d.Delete(ctx, "conf"); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, d, e, "conf", rootfs)
			if userns {
				checkNoSlots(t, d)
			}
		})
	}
}

// checkNoSlots fails if a slot of d's sandboxes is left in its mount dir.
func checkNoSlots(t *testing.T, d *Driver) {
	t.Helper()
	entries, err := os.ReadDir(d.mountDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		owner, err := os.Readlink(filepath.Join(d.mountDir, e.Name(), "owner"))
		if err == nil && strings.HasPrefix(owner, d.cfg.Root+"/") {
			t.Errorf("slot %s of %s left", e.Name(), owner)
		}
	}
	if m := testutil.Mounts(t, d.mountDir); len(m) > 0 {
		for _, mp := range m {
			owner, _ := os.Readlink(filepath.Join(filepath.Dir(mp), "owner"))
			if owner == "" || strings.HasPrefix(owner, d.cfg.Root+"/") {
				t.Errorf("mount %s (owner %q) left", mp, owner)
			}
		}
	}
}

// staleSlot leaves what a daemon that crashed and lost its state leaves:
// the slot of sandbox id, with a root mounted, whose sandbox directory is
// gone. It returns the slot and its mount point.
func staleSlot(t *testing.T, d *Driver, id string) (int, string) {
	t.Helper()
	dir := d.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	n, mnt, err := d.allocSlot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := bindRoot(testutil.BusyboxRootfs(t), mnt); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return n, mnt
}

// TestStaleSlot checks that a slot whose sandbox directory is gone (a
// daemon that crashed and lost its state) is reclaimed, mount included.
func TestStaleSlot(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	n, _ := staleSlot(t, d, "ghost")
	if !d.slotStale(n) {
		t.Fatal("slot of a removed sandbox directory is not stale")
	}
	other := d.dir("other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	n2, mnt2, err := d.allocSlotFrom(other, n)
	if err != nil {
		t.Fatal(err)
	}
	if n2 != n {
		t.Errorf("reallocated slot %d, want the stale %d", n2, n)
	}
	if m := testutil.Mounts(t, mnt2); len(m) != 0 {
		t.Errorf("stale mount kept: %v", m)
	}
	if err := d.releaseSlot(other); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.slotDir(n)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("slot dir after release: %v", err)
	}
	checkNoSlots(t, d)
}

// TestSweepStaleSlots: a new driver clears the slots a killed daemon left
// half made, one without its owner link and one whose owner is gone with a
// root still mounted and an owner change half done, and keeps a slot whose
// sandbox directory exists.
func TestSweepStaleSlots(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	live := d.dir("live")
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}
	kept, _, err := d.allocSlot(live)
	if err != nil {
		t.Fatal(err)
	}
	gone, mnt := staleSlot(t, d, "ghost")
	// Killed in the middle of a spare's claim (repoint), too.
	if err := os.Symlink(d.dir("ghost"), filepath.Join(d.slotDir(gone), "owner.new")); err != nil {
		t.Fatal(err)
	}
	// Killed between the slot's mkdir and its owner link.
	bare := (kept + 1 + rand.IntN(1000)) % idSlots
	for bare == gone {
		bare = (bare + 1) % idSlots
	}
	if err := os.Mkdir(d.slotDir(bare), 0o700); err != nil {
		t.Fatal(err)
	}

	e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	for _, n := range []int{gone, bare} {
		if _, err := os.Lstat(d.slotDir(n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale slot %d kept: %v", n, err)
		}
	}
	if m := testutil.Mounts(t, mnt); len(m) != 0 {
		t.Errorf("stale mount kept: %v", m)
	}
	if _, err := os.Stat(d.slotDir(kept)); err != nil {
		t.Errorf("live slot %d: %v", kept, err)
	}
	if err := d.releaseSlot(live); err != nil {
		t.Fatal(err)
	}
	checkNoSlots(t, d)
}

// TestSweepPastStuckSlot: a stale slot the sweep cannot clear (here one
// holding an entry nobody expects) stays and is reported, and the sweep
// still clears the others; an allocation whose search probes it moves on.
func TestSweepPastStuckSlot(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t, func(c *Config) { c.UserNamespaces = true })
	stuck, _ := staleSlot(t, d, "stuck")
	junk := filepath.Join(d.slotDir(stuck), "junk")
	if err := os.WriteFile(junk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(junk)
		d.clearSlot(stuck)
	})
	gone, mnt := staleSlot(t, d, "ghost")

	n, err := d.sweepSlots()
	if err == nil || !strings.Contains(err.Error(), "junk") {
		t.Errorf("sweep error = %v, want one naming the stuck slot's entry", err)
	}
	if n < 1 {
		t.Errorf("cleared %d slots, want the ghost's at least", n)
	}
	if _, err := os.Lstat(d.slotDir(gone)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale slot %d kept behind the stuck one: %v", gone, err)
	}
	if m := testutil.Mounts(t, mnt); len(m) != 0 {
		t.Errorf("stale mount kept: %v", m)
	}
	other := d.dir("other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	got, _, err := d.allocSlotFrom(other, stuck)
	if err != nil || got == stuck {
		t.Errorf("allocation from the stuck slot = %d, %v; want another slot", got, err)
	}
	if err := d.releaseSlot(other); err != nil {
		t.Fatal(err)
	}
}
