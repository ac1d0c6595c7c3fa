package network

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/corralrun/corral/internal/egress"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestRulesetGolden pins the ruleset the Manager writes for a few
// policies. Read testdata/ruleset.golden to review what a change does.
func TestRulesetGolden(t *testing.T) {
	ports := egress.DefaultServerPorts()
	mk := func(id, iface, host, addr string, p egress.Policy) renderedSandbox {
		p, err := p.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		return renderedSandbox{id: id, iface: iface, rules: sandboxRules(netip.MustParseAddr(host), netip.MustParseAddr(addr), ports, p)}
	}
	got := render("corral", "crl", netip.MustParsePrefix("10.200.0.0/16"), []renderedSandbox{
		mk("allow", "crl0", "10.200.0.1", "10.200.0.2", egress.Policy{Mode: egress.ModeAllowlist,
			Domains: []egress.DomainRule{{Name: "pypi.org"}},
		}),
		mk("cidrs", "crl1", "10.200.0.5", "10.200.0.6", egress.Policy{Mode: egress.ModeAllowlist,
			CIDRs: []egress.CIDRRule{
				{Prefix: netip.MustParsePrefix("10.1.0.0/16"), Ports: []uint16{5432}},      // explicit: opens a private range
				{Prefix: netip.MustParsePrefix("198.51.100.0/24")},                         // broad: after the blocked ranges
				{Prefix: netip.MustParsePrefix("169.254.169.254/32"), Ports: []uint16{80}}, // a single address is explicit
			},
		}),
		mk("open", "crl2", "10.200.0.9", "10.200.0.10", egress.Policy{Mode: egress.ModeOpen}),
	})
	path := filepath.Join("testdata", "ruleset.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("ruleset (-want +got):\n%s", diff)
	}
}

// Every rule must also compile to expressions; the kernel tests load them.
func TestRulesCompile(t *testing.T) {
	p, _ := egress.Policy{Mode: egress.ModeOpen, CIDRs: []egress.CIDRRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}.Normalize()
	for kind, rules := range sandboxRules(netip.MustParseAddr("10.200.0.1"), netip.MustParseAddr("10.200.0.2"), egress.DefaultServerPorts(), p) {
		for _, rl := range rules {
			if len(rl.exprs()) == 0 {
				t.Errorf("%s: rule %q has no expressions", kind, rl)
			}
		}
	}
}

func TestNetipMask(t *testing.T) {
	for bits, want := range map[int][]byte{0: {0, 0, 0, 0}, 8: {255, 0, 0, 0}, 10: {255, 192, 0, 0}, 30: {255, 255, 255, 252}} {
		if got := netipMask(bits); !cmp.Equal(got, want) {
			t.Errorf("netipMask(%d) = %v, want %v", bits, got, want)
		}
	}
}

func TestElementChain(t *testing.T) {
	// NFTA_VERDICT_CODE = NFT_JUMP, then NFTA_VERDICT_CHAIN "sb-x-pre", as
	// the kernel reports a verdict map element.
	val := []byte{8, 0, 1, 0, 0xff, 0xff, 0xff, 0xfd, 13, 0, 2, 0, 's', 'b', '-', 'x', '-', 'p', 'r', 'e', 0, 0, 0, 0}
	if got := elementChain(nftables.SetElement{Val: val}); got != "sb-x-pre" {
		t.Errorf("elementChain = %q", got)
	}
	if got := elementChain(nftables.SetElement{Val: []byte{1, 2}}); got != "" {
		t.Errorf("elementChain(garbage) = %q", got)
	}
}
