package runc

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
)

// newNetNS makes a network namespace owned by host root and bind-mounted
// at dir/netns, as the daemon's network package does, with a veth pair
// probe0/probe1 that only this namespace has. It is removed when the
// test ends.
func newNetNS(t *testing.T, dir string) string {
	t.Helper()
	path := testutil.NewNetNS(t, dir)
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNetworkNamespace runs sandboxes in a network namespace prepared on
// the host (driver.Spec.Network), with and without user namespaces: the
// sandbox is in that namespace, its /sys shows that namespace's
// interfaces, /etc/resolv.conf and /etc/hosts are the given files and
// read-only, root binds a low port, and nothing is left after Delete.
func TestNetworkNamespace(t *testing.T) {
	e := newEnv(t)
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			d := e.newDriver(t, func(c *Config) { c.UserNamespaces = userns })
			ctx := t.Context()
			rootfs := testutil.BusyboxRootfs(t)
			if err := d.PrepareTemplate(rootfs); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			nsPath := newNetNS(t, dir)
			var want unix.Stat_t
			if err := unix.Stat(nsPath, &want); err != nil {
				t.Fatal(err)
			}
			resolv, hosts := filepath.Join(dir, "resolv.conf"), filepath.Join(dir, "hosts")
			if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n127.0.1.1\tnetbox\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			err := d.Create(ctx, driver.Spec{ID: "net", RootFS: rootfs, Network: &driver.Network{
				NetNSPath: nsPath, ResolvConf: resolv, Hosts: hosts, Env: []string{"PROBE=1"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			out, err := execOnce(ctx, d, "net", `readlink /proc/self/ns/net; ls /sys/class/net | tr '\n' ' '; echo
cat /etc/resolv.conf /etc/hosts
echo x > /etc/resolv.conf 2>/dev/null && echo resolv.conf writable
nc -l -p 80 </dev/null >/dev/null & sleep 0.2; kill -0 $! 2>/dev/null && echo listening on 80; kill $! 2>/dev/null`)
			if err != nil {
				t.Fatal(err)
			}
			wantOut := fmt.Sprintf("net:[%d]\nlo probe0 probe1 \nnameserver 192.0.2.53\n127.0.0.1\tlocalhost\n127.0.1.1\tnetbox\nlistening on 80\n", want.Ino)
			if out != wantOut {
				t.Errorf("inside the sandbox:\n%s\nwant:\n%s", out, wantOut)
			}
			if err := d.Delete(ctx, "net"); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, d, e, "net", rootfs)
			if userns {
				checkNoSlots(t, d)
			}
			// The namespace is the daemon's: the sandbox leaves it be.
			var after unix.Stat_t
			if err := unix.Stat(nsPath, &after); err != nil || after.Ino != want.Ino {
				t.Errorf("prepared namespace changed by Delete: inode %d, %v; want %d", after.Ino, err, want.Ino)
			}
		})
	}
}
