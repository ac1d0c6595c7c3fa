package egress

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// Mode is a sandbox's network mode. The zero value is invalid on purpose:
// the server-wide default (none) is applied by the caller, not guessed here.
type Mode string

// The network modes.
const (
	// ModeNone gives the sandbox a loopback interface and nothing else.
	ModeNone Mode = "none"
	// ModeAllowlist lets the sandbox reach the domains and CIDRs its policy
	// names, and nothing else.
	ModeAllowlist Mode = "allowlist"
	// ModeOpen lets the sandbox reach any public address and name, but
	// still not the always-blocked ranges unless a CIDR rule names them.
	ModeOpen Mode = "open"
)

// DefaultPorts are the ports a DomainRule allows when it lists none.
func DefaultPorts() []uint16 { return []uint16{80, 443} }

// Policy is what a sandbox may reach. It is a plain value: JSON-encodable,
// comparable by content, and safe to share once normalized. Build it, call
// Normalize once, and hand the result to the network Manager; the matcher
// methods assume a normalized policy.
type Policy struct {
	Mode Mode `json:"mode"`
	// Domains are names the sandbox may resolve and reach through the
	// proxy. "example.test" matches only that name; "*.example.test"
	// matches every name below it but not example.test itself.
	Domains []DomainRule `json:"domains,omitempty"`
	// CIDRs are IPv4 destinations the sandbox may reach directly, by any
	// protocol, without the proxy. A rule whose prefix lies inside an
	// always-blocked range (or is a single address) names it explicitly
	// and opens it; a broader rule (0.0.0.0/0) never opens blocked ranges.
	CIDRs []CIDRRule `json:"cidrs,omitempty"`
	// Headers are set by the proxy on plaintext HTTP requests to matching
	// destinations, so that secrets never enter the sandbox. HTTPS is not
	// covered: the proxy does not terminate TLS.
	Headers []HeaderRule `json:"headers,omitempty"`
}

// DomainRule allows one name pattern on some ports.
type DomainRule struct {
	// Name is a DNS name, optionally starting with "*." (punycode for IDN).
	Name string `json:"name"`
	// Ports the proxy may connect to; empty means DefaultPorts (80, 443).
	Ports []uint16 `json:"ports,omitempty"`
}

// CIDRRule allows an IPv4 prefix, on some ports or on all of them.
type CIDRRule struct {
	Prefix netip.Prefix `json:"prefix"`
	// Ports apply to TCP and UDP; empty means every port and protocol.
	Ports []uint16 `json:"ports,omitempty"`
}

// HeaderRule sets one request header on plaintext HTTP requests whose
// authority matches Domain (same pattern syntax as DomainRule.Name). The
// header replaces any value the sandbox sent.
type HeaderRule struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	Value  string `json:"value"`
}

// LogValue keeps the secret out of logs.
func (h HeaderRule) LogValue() slog.Value {
	return slog.GroupValue(slog.String("domain", h.Domain), slog.String("name", h.Name), slog.String("value", "REDACTED"))
}

// AlwaysBlocked returns the IPv4 ranges no sandbox reaches unless a CIDR
// rule names them explicitly: "this network", private (RFC 1918), CGNAT
// (RFC 6598), loopback, link-local with the cloud metadata address,
// IETF protocol assignments, multicast, reserved and broadcast. The
// documentation and benchmarking ranges are not blocked; nothing real lives
// there, and tests use them as their "internet". The host's own addresses
// are blocked separately (they are not a fixed range). It returns a new
// slice on every call.
func AlwaysBlocked() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
}

// IsBlocked reports whether ip is in an always-blocked range. IPv6
// addresses are all blocked: sandboxes get no IPv6, and the proxy resolves
// only A records. An IPv4-mapped IPv6 address is judged as IPv4.
func IsBlocked(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.Is4() {
		return true
	}
	for _, p := range AlwaysBlocked() {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Explicit reports whether the rule names an always-blocked range (or a
// single address) on purpose, so that it opens what is otherwise blocked.
func (r CIDRRule) Explicit() bool {
	if r.Prefix.Bits() == 32 {
		return true
	}
	for _, b := range AlwaysBlocked() {
		if b.Bits() <= r.Prefix.Bits() && b.Contains(r.Prefix.Addr()) {
			return true
		}
	}
	return false
}

func (r CIDRRule) allows(ip netip.Addr, port uint16) bool {
	if !r.Prefix.Contains(ip) {
		return false
	}
	return len(r.Ports) == 0 || port == 0 || hasPort(r.Ports, port)
}

// Normalize validates p and returns it in canonical form: lower-case names
// without a trailing dot, masked prefixes. Errors wrap
// errdefs.ErrInvalidArgument.
func (p Policy) Normalize() (Policy, error) {
	out := Policy{Mode: p.Mode}
	switch p.Mode {
	case ModeNone:
		if len(p.Domains)+len(p.CIDRs)+len(p.Headers) > 0 {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "network mode none takes no rules")
		}
		return out, nil
	case ModeAllowlist, ModeOpen:
	default:
		return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown network mode %q (want none, allowlist or open)", p.Mode)
	}
	for _, d := range p.Domains {
		name, err := normalizePattern(d.Name)
		if err != nil {
			return Policy{}, err
		}
		if err := checkPorts(d.Ports); err != nil {
			return Policy{}, fmt.Errorf("domain %q: %w", d.Name, err)
		}
		out.Domains = append(out.Domains, DomainRule{Name: name, Ports: append([]uint16(nil), d.Ports...)})
	}
	for _, c := range p.CIDRs {
		if !c.Prefix.IsValid() || !c.Prefix.Addr().Is4() {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cidr %v: want an IPv4 prefix (IPv6 is not supported)", c.Prefix)
		}
		if err := checkPorts(c.Ports); err != nil {
			return Policy{}, fmt.Errorf("cidr %v: %w", c.Prefix, err)
		}
		out.CIDRs = append(out.CIDRs, CIDRRule{Prefix: c.Prefix.Masked(), Ports: append([]uint16(nil), c.Ports...)})
	}
	for _, h := range p.Headers {
		dom, err := normalizePattern(h.Domain)
		if err != nil {
			return Policy{}, err
		}
		if !validHeaderName(h.Name) || strings.ContainsAny(h.Value, "\r\n\x00") {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "header rule for %q: invalid header name or value", h.Domain)
		}
		out.Headers = append(out.Headers, HeaderRule{Domain: dom, Name: h.Name, Value: h.Value})
	}
	return out, nil
}

// AllowsName reports whether the sandbox may resolve name (on some port).
// Names that are IP literals or not valid DNS names are never allowed.
func (p Policy) AllowsName(name string) bool {
	n, ok := canonicalName(name)
	if !ok {
		return false
	}
	switch p.Mode {
	case ModeOpen:
		return true
	case ModeAllowlist:
		for _, d := range p.Domains {
			if matchPattern(d.Name, n) {
				return true
			}
		}
	}
	return false
}

// AllowsHost reports whether the proxy may connect the sandbox to name on
// port. In open mode every valid name and port is allowed; the addresses
// the name resolves to are checked separately.
func (p Policy) AllowsHost(name string, port uint16) bool {
	n, ok := canonicalName(name)
	if !ok {
		return false
	}
	switch p.Mode {
	case ModeOpen:
		return true
	case ModeAllowlist:
		for _, d := range p.Domains {
			if !matchPattern(d.Name, n) {
				continue
			}
			ports := d.Ports
			if len(ports) == 0 {
				ports = DefaultPorts()
			}
			if hasPort(ports, port) {
				return true
			}
		}
	}
	return false
}

// AllowsAddr reports whether the sandbox may reach ip:port by address,
// without a name: an explicit CIDR rule opens even blocked ranges; else
// blocked ranges are closed; else a broader CIDR rule or open mode opens
// it. Port 0 means "any port" (used for DNS answers). IPv6 is never
// allowed. The host's own addresses are the caller's concern (they are
// host state, not policy).
func (p Policy) AllowsAddr(ip netip.Addr, port uint16) bool {
	ip = ip.Unmap()
	if !ip.Is4() || p.Mode == ModeNone {
		return false
	}
	if p.NamesAddr(ip, port) {
		return true
	}
	if IsBlocked(ip) {
		return false
	}
	for _, c := range p.CIDRs {
		if c.allows(ip, port) {
			return true
		}
	}
	return p.Mode == ModeOpen
}

// NamesAddr reports whether an explicit CIDR rule (see CIDRRule.Explicit)
// covers ip:port. Such a rule is the only way to reach blocked ranges and
// the host's own addresses.
func (p Policy) NamesAddr(ip netip.Addr, port uint16) bool {
	ip = ip.Unmap()
	for _, c := range p.CIDRs {
		if c.Explicit() && c.allows(ip, port) {
			return true
		}
	}
	return false
}

// headersFor returns the header rules that apply to requests for name.
func (p Policy) headersFor(name string) []HeaderRule {
	n, ok := canonicalName(name)
	if !ok {
		return nil
	}
	var out []HeaderRule
	for _, h := range p.Headers {
		if matchPattern(h.Domain, n) {
			out = append(out, h)
		}
	}
	return out
}

func matchPattern(pattern, name string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return pattern == name
}

func hasPort(ports []uint16, port uint16) bool {
	for _, p := range ports {
		if p == port {
			return true
		}
	}
	return false
}

func checkPorts(ports []uint16) error {
	for _, p := range ports {
		if p == 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "port 0 is not a port")
		}
	}
	return nil
}

func normalizePattern(s string) (string, error) {
	rest, wild := strings.CutPrefix(s, "*.")
	n, ok := canonicalName(rest)
	if !ok {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "domain %q: want a DNS name, optionally starting with \"*.\"", s)
	}
	if wild {
		return "*." + n, nil
	}
	return n, nil
}

// canonicalName lower-cases name, drops one trailing dot and checks that it
// is a host name: 1-253 characters, labels of 1-63 letters, digits, '-' or
// '_', not an IP literal.
func canonicalName(name string) (string, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if len(name) == 0 || len(name) > 253 {
		return "", false
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", false
	}
	for label := range strings.SplitSeq(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return name, true
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
