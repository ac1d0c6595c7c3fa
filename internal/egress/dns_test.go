package egress

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func query(t *testing.T, server netip.AddrPort, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	resp, _, err := c.Exchange(m, server.String())
	if err != nil {
		t.Fatalf("query %s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return resp
}

func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

func TestDNS(t *testing.T) {
	f := newFixture(t, Policy{Mode: ModeAllowlist,
		Domains: []DomainRule{{Name: "allowed.test"}, {Name: "*.wild.test"}, {Name: "rebind.test"}, {Name: "meta.test"},
			{Name: "private.test"}, {Name: "mixed.test"}, {Name: "self.test"}},
	})
	long := strings.Repeat("a", 60)
	tests := []struct {
		name      string
		qname     string
		qtype     uint16
		wantRcode int
		wantAddrs []string
		// upstream says whether the name may reach the upstream resolver.
		upstream bool
	}{
		{name: "allowed", qname: "allowed.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, wantAddrs: []string{addrA}, upstream: true},
		{name: "allowed mixed case", qname: "ALLOWED.Test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, wantAddrs: []string{addrA}, upstream: true},
		{name: "wildcard", qname: "a.wild.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, wantAddrs: []string{addrA}, upstream: true},
		{name: "not allowed", qname: "other.test", qtype: dns.TypeA, wantRcode: dns.RcodeNameError},
		{name: "suffix trick", qname: "allowed.test.other.test", qtype: dns.TypeA, wantRcode: dns.RcodeNameError},
		{name: "aaaa allowed is empty", qname: "allowed.test", qtype: dns.TypeAAAA, wantRcode: dns.RcodeSuccess},
		{name: "https allowed is empty", qname: "allowed.test", qtype: dns.TypeHTTPS, wantRcode: dns.RcodeSuccess},
		{name: "txt refused", qname: "allowed.test", qtype: dns.TypeTXT, wantRcode: dns.RcodeRefused},
		{name: "any refused", qname: "allowed.test", qtype: dns.TypeANY, wantRcode: dns.RcodeRefused},
		{name: "null refused", qname: "allowed.test", qtype: dns.TypeNULL, wantRcode: dns.RcodeRefused},
		{name: "txt on other refused", qname: "other.test", qtype: dns.TypeTXT, wantRcode: dns.RcodeRefused},
		{name: "long label under wildcard", qname: long + ".wild.test", qtype: dns.TypeA, wantRcode: dns.RcodeRefused},
		{name: "long name under wildcard", qname: strings.Repeat("abcdefghij.", 13) + "wild.test", qtype: dns.TypeA, wantRcode: dns.RcodeRefused},
		{name: "long label elsewhere", qname: long + ".exfil.test", qtype: dns.TypeA, wantRcode: dns.RcodeRefused},
		{name: "rebinding to loopback", qname: "rebind.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, upstream: true},
		{name: "rebinding to metadata", qname: "meta.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, upstream: true},
		{name: "rebinding to private", qname: "private.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, upstream: true},
		{name: "mixed keeps public only", qname: "mixed.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, wantAddrs: []string{addrA}, upstream: true},
	}
	if localIPv4(t) != "" {
		tests = append(tests, struct {
			name      string
			qname     string
			qtype     uint16
			wantRcode int
			wantAddrs []string
			upstream  bool
		}{name: "host's own address", qname: "self.test", qtype: dns.TypeA, wantRcode: dns.RcodeSuccess, upstream: true})
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				resp := query(t, f.addrs.DNS, network, tt.qname, tt.qtype)
				if resp.Rcode != tt.wantRcode {
					t.Errorf("rcode = %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tt.wantRcode])
				}
				if got := answers(resp); !slices.Equal(got, tt.wantAddrs) {
					t.Errorf("answers = %v, want %v", got, tt.wantAddrs)
				}
				if !tt.upstream && slices.Contains(f.up.Asked(), strings.ToLower(tt.qname)+"/"+dns.TypeToString[tt.qtype]) {
					t.Errorf("upstream was asked about %s; refused names must not leave the host", tt.qname)
				}
			})
		}
	}
	if asked := f.up.Asked(); slices.ContainsFunc(asked, func(q string) bool { return !strings.HasSuffix(q, "/A") }) {
		t.Errorf("upstream got non-A questions: %v", asked)
	}
	if !strings.Contains(f.log.String(), "sandbox_id=sb1 via=dns host=other.test qtype=A allowed=false") {
		t.Errorf("decision for other.test not logged:\n%s", f.log.String())
	}
}

func TestDNSExplicitCIDRKeepsPrivateAnswer(t *testing.T) {
	f := newFixture(t, Policy{Mode: ModeAllowlist,
		Domains: []DomainRule{{Name: "private.test"}},
		CIDRs:   []CIDRRule{{Prefix: netip.MustParsePrefix("10.1.2.0/24")}},
	})
	if got := answers(query(t, f.addrs.DNS, "udp", "private.test", dns.TypeA)); !slices.Equal(got, []string{"10.1.2.3"}) {
		t.Errorf("answers = %v, want the explicitly allowed private address", got)
	}
}

func TestDNSModes(t *testing.T) {
	f := newFixture(t, Policy{Mode: ModeOpen})
	if got := answers(query(t, f.addrs.DNS, "udp", "other.test", dns.TypeA)); !slices.Equal(got, []string{addrB}) {
		t.Errorf("open mode: answers = %v, want %v", got, []string{addrB})
	}
	if resp := query(t, f.addrs.DNS, "udp", "rebind.test", dns.TypeA); len(resp.Answer) != 0 {
		t.Errorf("open mode: rebinding answer %v not dropped", resp.Answer)
	}
	if err := f.srv.SetPolicy("sb1", Policy{Mode: ModeNone}); err != nil {
		t.Fatal(err)
	}
	if resp := query(t, f.addrs.DNS, "udp", "other.test", dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Errorf("none mode: rcode = %s, want NXDOMAIN", dns.RcodeToString[resp.Rcode])
	}
}

func TestDNSLiveUpdate(t *testing.T) {
	f := newFixture(t, Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "allowed.test"}}})
	if resp := query(t, f.addrs.DNS, "udp", "other.test", dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Fatalf("before update: rcode = %s", dns.RcodeToString[resp.Rcode])
	}
	if err := f.srv.SetPolicy("sb1", Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "allowed.test"}, {Name: "other.test"}}}); err != nil {
		t.Fatal(err)
	}
	if got := answers(query(t, f.addrs.DNS, "udp", "other.test", dns.TypeA)); !slices.Equal(got, []string{addrB}) {
		t.Errorf("after update: answers = %v", got)
	}
}
