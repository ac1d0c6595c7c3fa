package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

func mustNormalize(t *testing.T, p Policy) Policy {
	t.Helper()
	n, err := p.Normalize()
	if err != nil {
		t.Fatalf("Normalize(%+v): %v", p, err)
	}
	return n
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		in      Policy
		want    Policy
		wantErr bool
	}{
		{name: "zero mode", in: Policy{}, wantErr: true},
		{name: "unknown mode", in: Policy{Mode: "closed"}, wantErr: true},
		{name: "none", in: Policy{Mode: ModeNone}, want: Policy{Mode: ModeNone}},
		{name: "none with rules", in: Policy{Mode: ModeNone, Domains: []DomainRule{{Name: "a.test"}}}, wantErr: true},
		{
			name: "canonical names and prefixes",
			in: Policy{Mode: ModeAllowlist,
				Domains: []DomainRule{{Name: "PyPI.Org."}, {Name: "*.Example.TEST", Ports: []uint16{443}}},
				CIDRs:   []CIDRRule{{Prefix: netip.MustParsePrefix("10.1.2.3/24")}},
				Headers: []HeaderRule{{Domain: "API.example.test", Name: "Authorization", Value: "Bearer x"}}},
			want: Policy{Mode: ModeAllowlist,
				Domains: []DomainRule{{Name: "pypi.org"}, {Name: "*.example.test", Ports: []uint16{443}}},
				CIDRs:   []CIDRRule{{Prefix: netip.MustParsePrefix("10.1.2.0/24")}},
				Headers: []HeaderRule{{Domain: "api.example.test", Name: "Authorization", Value: "Bearer x"}}},
		},
		{name: "wildcard in the middle", in: Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "a.*.test"}}}, wantErr: true},
		{name: "bare star", in: Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "*"}}}, wantErr: true},
		{name: "ip as domain", in: Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "1.2.3.4"}}}, wantErr: true},
		{name: "space in domain", in: Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "a b.test"}}}, wantErr: true},
		{name: "port zero", in: Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "a.test", Ports: []uint16{0}}}}, wantErr: true},
		{name: "ipv6 cidr", in: Policy{Mode: ModeAllowlist, CIDRs: []CIDRRule{{Prefix: netip.MustParsePrefix("fd00::/8")}}}, wantErr: true},
		{name: "header injection via newline", in: Policy{Mode: ModeAllowlist, Headers: []HeaderRule{{Domain: "a.test", Name: "X", Value: "a\r\nEvil: 1"}}}, wantErr: true},
		{name: "bad header name", in: Policy{Mode: ModeAllowlist, Headers: []HeaderRule{{Domain: "a.test", Name: "X Y", Value: "1"}}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.Normalize()
			if tt.wantErr {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("Normalize: err = %v, want invalid argument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("Normalize (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAllowsName(t *testing.T) {
	allow := mustNormalize(t, Policy{Mode: ModeAllowlist, Domains: []DomainRule{
		{Name: "allowed.test"}, {Name: "*.wild.test", Ports: []uint16{443}},
	}})
	open := mustNormalize(t, Policy{Mode: ModeOpen})
	none := mustNormalize(t, Policy{Mode: ModeNone})
	tests := []struct {
		name   string
		policy Policy
		host   string
		port   uint16
		want   bool // AllowsName
		wantHP bool // AllowsHost(host, port)
	}{
		{"exact", allow, "allowed.test", 443, true, true},
		{"exact http", allow, "allowed.test", 80, true, true},
		{"exact other port", allow, "allowed.test", 22, true, false},
		{"case and trailing dot", allow, "ALLOWED.test.", 443, true, true},
		{"subdomain of exact", allow, "a.allowed.test", 443, false, false},
		{"suffix trick", allow, "notallowed.test", 443, false, false},
		{"allowed as a label", allow, "allowed.test.evil.test", 443, false, false},
		{"wildcard child", allow, "a.wild.test", 443, true, true},
		{"wildcard grandchild", allow, "a.b.wild.test", 443, true, true},
		{"wildcard port not listed", allow, "a.wild.test", 80, true, false},
		{"wildcard apex", allow, "wild.test", 443, false, false},
		{"wildcard suffix trick", allow, "evilwild.test", 443, false, false},
		{"ip literal", allow, "198.18.0.10", 443, false, false},
		{"empty", allow, "", 443, false, false},
		{"garbage", allow, "allowed.test/..", 443, false, false},
		{"open any name", open, "anything.test", 8443, true, true},
		{"open ip literal is not a name", open, "198.18.0.10", 443, false, false},
		{"none", none, "allowed.test", 443, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.AllowsName(tt.host); got != tt.want {
				t.Errorf("AllowsName(%q) = %v, want %v", tt.host, got, tt.want)
			}
			if got := tt.policy.AllowsHost(tt.host, tt.port); got != tt.wantHP {
				t.Errorf("AllowsHost(%q, %d) = %v, want %v", tt.host, tt.port, got, tt.wantHP)
			}
		})
	}
}

func TestAllowsAddr(t *testing.T) {
	allow := mustNormalize(t, Policy{Mode: ModeAllowlist, CIDRs: []CIDRRule{
		{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []uint16{5432}},
		{Prefix: netip.MustParsePrefix("10.9.0.0/16")},                    // explicit: inside 10/8
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Ports: []uint16{22}}, // broad: never opens blocked ranges
	}})
	open := mustNormalize(t, Policy{Mode: ModeOpen})
	openMeta := mustNormalize(t, Policy{Mode: ModeOpen, CIDRs: []CIDRRule{{Prefix: netip.MustParsePrefix("169.254.169.254/32"), Ports: []uint16{80}}}})
	tests := []struct {
		name   string
		policy Policy
		addr   string
		port   uint16
		want   bool
	}{
		{"cidr with port", allow, "203.0.113.7", 5432, true},
		{"cidr other port", allow, "203.0.113.7", 5433, false},
		{"explicit private", allow, "10.9.1.1", 1234, true},
		{"other private", allow, "10.8.1.1", 1234, false},
		{"broad rule public", allow, "198.51.100.1", 22, true},
		{"broad rule does not open private", allow, "192.168.1.1", 22, false},
		{"broad rule does not open loopback", allow, "127.0.0.1", 22, false},
		{"broad rule does not open metadata", allow, "169.254.169.254", 22, false},
		{"not in any rule", allow, "198.51.100.1", 80, false},
		{"ipv6", allow, "2001:db8::1", 22, false},
		{"mapped ipv4 is judged as ipv4", allow, "::ffff:10.9.1.1", 1, true},
		{"open public", open, "198.51.100.1", 443, true},
		{"open private", open, "10.0.0.1", 443, false},
		{"open cgnat", open, "100.64.1.1", 443, false},
		{"open 172.16/12", open, "172.31.255.255", 443, false},
		{"open 172.32 is public", open, "172.32.0.1", 443, true},
		{"open metadata", open, "169.254.169.254", 80, false},
		{"open multicast", open, "224.0.0.1", 80, false},
		{"open broadcast", open, "255.255.255.255", 80, false},
		{"open zero", open, "0.0.0.0", 80, false},
		{"open explicit metadata", openMeta, "169.254.169.254", 80, true},
		{"open explicit metadata other port", openMeta, "169.254.169.254", 81, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.AllowsAddr(netip.MustParseAddr(tt.addr), tt.port); got != tt.want {
				t.Errorf("AllowsAddr(%s, %d) = %v, want %v", tt.addr, tt.port, got, tt.want)
			}
		})
	}
}

func TestExplicit(t *testing.T) {
	tests := []struct {
		prefix string
		want   bool
	}{
		{"10.1.0.0/16", true},
		{"10.0.0.0/8", true},
		{"169.254.169.254/32", true},
		{"198.51.100.7/32", true},
		{"0.0.0.0/0", false},
		{"8.0.0.0/6", false}, // contains 10/8 but does not name it
		{"198.51.100.0/24", false},
	}
	for _, tt := range tests {
		if got := (CIDRRule{Prefix: netip.MustParsePrefix(tt.prefix)}).Explicit(); got != tt.want {
			t.Errorf("Explicit(%s) = %v, want %v", tt.prefix, got, tt.want)
		}
	}
}

func TestHeaderRuleLogValueRedacts(t *testing.T) {
	v := HeaderRule{Domain: "a.test", Name: "Authorization", Value: "Bearer secret"}.LogValue()
	if got := v.String(); got == "" || strings.Contains(got, "secret") {
		t.Errorf("LogValue = %q, must not contain the secret", got)
	}
}

func TestNormalizeRules(t *testing.T) {
	ph := PlaceholderRule{Domain: "api.example.test", Env: "API_KEY", Secret: "api-key", Placeholder: apiPlaceholder}
	base := func(mod func(*Policy)) Policy {
		p := Policy{Mode: ModeAllowlist, Domains: []DomainRule{{Name: "api.example.test"}, {Name: "*.wild.test"}}}
		mod(&p)
		return p
	}
	header := func(dom, value string) func(*Policy) {
		return func(p *Policy) { p.Headers = []HeaderRule{{Domain: dom, Name: "Authorization", Value: value}} }
	}
	placeholder := func(mod func(*PlaceholderRule)) func(*Policy) {
		return func(p *Policy) {
			r := ph
			mod(&r)
			p.Placeholders = []PlaceholderRule{r}
		}
	}
	tests := []struct {
		name    string
		in      Policy
		wantErr string // substring; empty means valid
	}{
		{"secret template", base(header("api.example.test", "Bearer {{secret:api-token}} and {{secret:b.2_x}}")), ""},
		{"literal braces closing only", base(header("api.example.test", "a}}b")), ""},
		{"unknown template kind", base(header("api.example.test", "{{env:HOME}}")), "want {{secret:NAME}}"},
		{"unclosed template", base(header("api.example.test", "Bearer {{secret:x")), "without"},
		{"empty template", base(header("api.example.test", "{{}}")), "want {{secret:NAME}}"},
		{"upper-case secret name", base(header("api.example.test", "{{secret:Token}}")), "want {{secret:NAME}}"},
		{"secret name too long", base(header("api.example.test", "{{secret:"+strings.Repeat("a", 64)+"}}")), "want {{secret:NAME}}"},
		{"spaces in template", base(header("api.example.test", "{{ secret:x }}")), "want {{secret:NAME}}"},
		{"header for a name not allowed", base(header("other.test", "x")), "rule for other.test: domain not allowed by the policy"},
		{"header under a wildcard", base(header("a.wild.test", "x")), ""},
		{"wildcard header under a wildcard", base(header("*.b.wild.test", "x")), ""},
		{"wildcard header for an exact name", base(header("*.api.example.test", "x")), "domain not allowed"},
		{"wildcard apex", base(header("wild.test", "x")), "domain not allowed"},
		{"open mode allows any rule domain", Policy{Mode: ModeOpen, Headers: []HeaderRule{{Domain: "x.test", Name: "A", Value: "b"}}}, ""},
		{"placeholder", base(placeholder(func(*PlaceholderRule) {})), ""},
		{"placeholder for a name not allowed", base(placeholder(func(r *PlaceholderRule) { r.Domain = "other.test" })), "domain not allowed by the policy"},
		{"placeholder bad env", base(placeholder(func(r *PlaceholderRule) { r.Env = "1KEY" })), "env"},
		{"placeholder env with dash", base(placeholder(func(r *PlaceholderRule) { r.Env = "API-KEY" })), "env"},
		{"placeholder bad secret", base(placeholder(func(r *PlaceholderRule) { r.Secret = "-x" })), "secret"},
		{"placeholder short", base(placeholder(func(r *PlaceholderRule) { r.Placeholder = PlaceholderPrefix + "abc" })), "placeholder"},
		{"placeholder upper-case hex", base(placeholder(func(r *PlaceholderRule) { r.Placeholder = strings.ToUpper(apiPlaceholder) })), "placeholder"},
		{"placeholder without prefix", base(placeholder(func(r *PlaceholderRule) { r.Placeholder = "0123456789abcdef0123456789abcdef" })), "placeholder"},
		{"one env, two secrets", base(func(p *Policy) {
			p.Placeholders = []PlaceholderRule{ph, {Domain: "a.wild.test", Env: "API_KEY", Secret: "other", Placeholder: apiPlaceholder}}
		}), "different secrets"},
		{"one env, two domains", base(func(p *Policy) {
			p.Placeholders = []PlaceholderRule{ph, {Domain: "*.wild.test", Env: "API_KEY", Secret: "api-key", Placeholder: apiPlaceholder}}
		}), ""},
		{"two envs, one placeholder", base(func(p *Policy) {
			p.Placeholders = []PlaceholderRule{ph, {Domain: "*.wild.test", Env: "OTHER", Secret: "api-key", Placeholder: apiPlaceholder}}
		}), "share a placeholder"},
		{"none with placeholders", Policy{Mode: ModeNone, Placeholders: []PlaceholderRule{ph}}, "takes no rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.in.Normalize()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Normalize: %v", err)
			case tt.wantErr != "" && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Normalize: err = %v, want invalid argument containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSecretRefs(t *testing.T) {
	p := mustNormalize(t, interceptPolicy())
	p.Headers = append(p.Headers, HeaderRule{Domain: "api.example.test", Name: "X-Two", Value: "{{secret:b}}{{secret:api-token}}"})
	if diff := cmp.Diff([]string{"api-key", "api-token", "b"}, p.SecretRefs()); diff != "" {
		t.Errorf("SecretRefs (-want +got):\n%s", diff)
	}
	if got := (Policy{Mode: ModeOpen}).SecretRefs(); len(got) != 0 {
		t.Errorf("SecretRefs of a policy without rules = %v", got)
	}
}

func TestPlaceholderRuleLogValue(t *testing.T) {
	v := PlaceholderRule{Domain: "a.test", Env: "KEY", Secret: "k", Placeholder: apiPlaceholder}.LogValue()
	if got := v.String(); !strings.Contains(got, "KEY") || strings.Contains(got, apiPlaceholder) {
		t.Errorf("LogValue = %q", got)
	}
}
