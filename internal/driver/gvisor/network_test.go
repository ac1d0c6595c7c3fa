package gvisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
	"github.com/corralrun/corral/internal/testutil"
)

// TestNetworkNamespace runs a sandbox in a network namespace prepared on
// the host (driver.Spec.Network): gVisor's netstack takes over the
// namespace's interface and address, /etc/resolv.conf and /etc/hosts are
// the given files and read-only, and the namespace is left to its owner
// after Delete.
func TestNetworkNamespace(t *testing.T) {
	e := newEnv(t)
	for _, shifted := range []bool{true, false} {
		t.Run(fmt.Sprintf("shifted=%v", shifted), func(t *testing.T) {
			rootfs := e.rootfs(t)
			if shifted {
				rootfs = e.shiftedRootfs(t)
			}
			testNetworkNamespace(t, e, rootfs)
		})
	}
}

func testNetworkNamespace(t *testing.T, e env, rootfs string) {
	d := e.newDriver(t, nil)
	ctx := t.Context()
	dir := t.TempDir()
	nsPath := testutil.NewNetNS(t, dir)
	ns, err := netns.GetFromPath(nsPath)
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
	link, err := h.LinkByName("probe0")
	if err != nil {
		t.Fatal(err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 0, 2, 10), Mask: net.CIDRMask(24, 32)}}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"probe0", "probe1"} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	resolv, hosts := filepath.Join(dir, "resolv.conf"), filepath.Join(dir, "hosts")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n127.0.1.1\tnetbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = d.Create(ctx, driver.Spec{ID: "net", RootFS: rootfs, Network: &driver.Network{
		NetNSPath: nsPath, ResolvConf: resolv, Hosts: hosts, Env: []string{"PROBE=1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := drivertest.ExecOnce(ctx, d, "net", `ip -4 addr show probe0 | grep -o 'inet [0-9./]*'
cat /etc/resolv.conf /etc/hosts
{ echo x > /etc/resolv.conf; } 2>/dev/null && echo resolv.conf writable`)
	if err != nil {
		t.Fatal(err)
	}
	want := "inet 192.0.2.10/24\nnameserver 192.0.2.53\n127.0.0.1\tlocalhost\n127.0.1.1\tnetbox\n"
	if out != want {
		t.Errorf("inside the sandbox:\n%s\nwant:\n%s", out, want)
	}
	if err := d.Delete(ctx, "net"); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, d, e)
	if _, err := h.LinkByName("probe0"); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Errorf("looking up the namespace's link after Delete: %v", err)
	}
}
