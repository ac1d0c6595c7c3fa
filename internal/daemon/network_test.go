package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestResolvConfServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	conf := "# comment\nsearch example.test\nnameserver 192.0.2.53\nnameserver 2001:db8::53\nnameserver fe80::1%eth0\nnameserver bogus\noptions ndots:2\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := resolvConfServers(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[2001:db8::53]:53")}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("servers (-want +got):\n%s", diff)
	}
	if got, err := resolvConfServers(filepath.Join(t.TempDir(), "missing")); err != nil || len(got) != 0 {
		t.Errorf("missing file: %v, %v", got, err)
	}
}

func TestUpstreamsFlag(t *testing.T) {
	var v []netip.AddrPort
	f := upstreamsFlag{&v}
	for _, s := range []string{"192.0.2.1", "127.0.0.1:5353,[2001:db8::1]:53"} {
		if err := f.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if got, want := f.String(), "192.0.2.1:53,127.0.0.1:5353,[2001:db8::1]:53"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "dns.example.test", "192.0.2.1:port"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) succeeded", bad)
		}
	}
}

func TestNetworkDefaults(t *testing.T) {
	c := Config{StateDir: t.TempDir(), Storage: "overlay", AgentPath: "/bin/true"}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.DefaultNetwork != "none" || c.NetworkSubnet.String() != DefaultNetworkSubnet || c.NetworkPrefix != "crl" || c.NetworkTable != "corral" {
		t.Errorf("defaults: mode %q subnet %v prefix %q table %q", c.DefaultNetwork, c.NetworkSubnet, c.NetworkPrefix, c.NetworkTable)
	}
	c = Config{StateDir: t.TempDir(), Storage: "overlay", AgentPath: "/bin/true", DefaultNetwork: "wide"}
	if err := c.setDefaults(); err == nil {
		t.Error("unknown default network mode accepted")
	}
}
