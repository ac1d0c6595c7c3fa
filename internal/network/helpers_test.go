package network

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/testutil"
)

func randLetters(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, n)
	for i := range b {
		v, _ := rand.Int(rand.Reader, big.NewInt(int64(len(letters))))
		b[i] = letters[v.Int64()]
	}
	return string(b)
}

// testConfig returns a Config with a name prefix, table and /22 of its own,
// so tests never touch a running daemon's objects or each other's.
func testConfig(t testing.TB) Config {
	t.Helper()
	testutil.RequiresRoot(t)
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	var subnet netip.Prefix
	for range 100 {
		v, _ := rand.Int(rand.Reader, big.NewInt(64*64))
		n := v.Int64()
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(192 + n/64), byte(n%64) * 4, 0}), 22)
		free := true
		for _, r := range routes {
			if r.Dst != nil {
				if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
					ones, _ := r.Dst.Mask.Size()
					if ones > 0 && p.Overlaps(netip.PrefixFrom(a, ones)) {
						free = false
					}
				}
			}
		}
		if free {
			subnet = p
			break
		}
	}
	if !subnet.IsValid() {
		t.Fatal("no free test subnet")
	}
	id := randLetters(4)
	return Config{
		Subnet:     subnet,
		StateDir:   t.TempDir(),
		NamePrefix: "ct" + id,
		Table:      "corral-test-" + id,
		Ports:      egress.DefaultServerPorts(),
	}
}

// newTestManager returns a Manager that tears down whatever it still has
// at the end of the test, closes, and then checks that nothing is left.
func newTestManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		ids, err := m.List(ctx)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, id := range ids {
			if err := m.Teardown(ctx, id); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := m.Close(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		assertClean(t, cfg, true)
		forceClean(cfg)
	})
	return m
}

// forceClean removes whatever a failed test left, without the Manager.
func forceClean(cfg Config) {
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cfg.NamePrefix) {
			_ = netlink.LinkDel(l)
		}
	}
	files, _ := os.ReadDir(filepath.Join(cfg.StateDir, "netns"))
	for _, f := range files {
		_ = removeNetNS(filepath.Join(cfg.StateDir, "netns", f.Name()))
	}
	_ = newNFT(cfg.Table, cfg.NamePrefix, cfg.Subnet).deleteTable()
}

// leftovers lists every host object of cfg's Manager: interfaces with the
// prefix, namespace files and mounts, sandbox chains, addresses and routes
// in the subnet, and (if tableToo) the table itself.
func leftovers(t testing.TB, cfg Config, tableToo bool) []string {
	t.Helper()
	var out []string
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cfg.NamePrefix) {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	files, _ := os.ReadDir(filepath.Join(cfg.StateDir, "netns"))
	for _, f := range files {
		out = append(out, "netns file "+f.Name())
	}
	for _, mp := range testutil.Mounts(t, cfg.StateDir) {
		out = append(out, "mount "+mp)
	}
	addrs, _ := netlink.AddrList(nil, unix.AF_INET)
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && cfg.Subnet.Contains(ip) {
			out = append(out, "address "+ip.String())
		}
	}
	routes, _ := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	for _, r := range routes {
		if r.Dst != nil {
			if ip, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && cfg.Subnet.Contains(ip) {
				out = append(out, "route "+r.Dst.String())
			}
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, _ := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	for _, ch := range chains {
		if ch.Table.Name == cfg.Table && strings.HasPrefix(ch.Name, "sb-") {
			out = append(out, "chain "+ch.Name)
		}
	}
	if tableToo {
		tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
		for _, tb := range tables {
			if tb.Name == cfg.Table {
				out = append(out, "table "+tb.Name)
			}
		}
	}
	out = append(out, foreignThreads()...)
	slices.Sort(out)
	return out
}

// foreignThreads lists this process's threads that are not in the root
// network namespace (PID 1's): a thread left in a sandbox's namespace
// keeps that namespace, and its veth, alive.
func foreignThreads() []string {
	root, err := os.Readlink("/proc/1/ns/net")
	if err != nil {
		return nil
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []string
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err == nil && ns != root {
			out = append(out, "thread "+task.Name()+" in "+ns)
		}
	}
	return out
}

func assertClean(t testing.TB, cfg Config, tableToo bool) {
	t.Helper()
	if left := leftovers(t, cfg, tableToo); len(left) > 0 {
		t.Errorf("leftovers: %v", left)
	}
}

// nftList returns the `nft list table` output of cfg's table, as the
// kernel holds it; the test fails if the table cannot be listed.
func nftList(t testing.TB, cfg Config) string {
	t.Helper()
	nft := testutil.RequiresBinary(t, "nft")
	out, err := exec.Command(nft, "list", "table", "inet", cfg.Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table inet %s: %v\n%s", cfg.Table, err, out)
	}
	return string(out)
}

// fakeEgress records calls and can fail Attach.
type fakeEgress struct {
	ports egress.Ports

	mu       sync.Mutex
	attached map[string]egress.Policy
	failWith error
}

func newFakeEgress() *fakeEgress {
	return &fakeEgress{ports: egress.DefaultServerPorts(), attached: map[string]egress.Policy{}}
}

func (f *fakeEgress) Ports() egress.Ports { return f.ports }

func (f *fakeEgress) Attach(_ context.Context, id string, _ netip.Addr, p egress.Policy) (egress.Addrs, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWith != nil {
		return egress.Addrs{}, f.failWith
	}
	if _, ok := f.attached[id]; ok {
		return egress.Addrs{}, fmt.Errorf("fake: %s attached twice", id)
	}
	f.attached[id] = p
	return egress.Addrs{}, nil
}

func (f *fakeEgress) SetPolicy(id string, p egress.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.attached[id]; !ok {
		return fmt.Errorf("fake: %s not attached", id)
	}
	f.attached[id] = p
	return nil
}

func (f *fakeEgress) Detach(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.attached, id)
	return nil
}

func (f *fakeEgress) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.attached {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
