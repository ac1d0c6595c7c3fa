package egress

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
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
	// Headers are set by the proxy on requests to matching destinations,
	// so that secrets never enter the sandbox: on plaintext HTTP, and on
	// HTTPS when the Server has a CA (the proxy then terminates TLS for
	// those names only).
	Headers []HeaderRule `json:"headers,omitempty"`
	// Placeholders are stand-ins the sandbox holds instead of secrets; the
	// proxy swaps them for the secrets' values in requests to their
	// domains (HTTPS as for Headers).
	Placeholders []PlaceholderRule `json:"placeholders,omitempty"`
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

// HeaderRule sets one request header on requests whose authority matches
// Domain (same pattern syntax as DomainRule.Name). The header replaces any
// value the sandbox sent. Value may reference secrets as
// {{secret:NAME}}; the proxy resolves them through Config.Secrets for
// every request, so a rotated secret is used from the next request on.
type HeaderRule struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	Value  string `json:"value"`
}

// LogValue keeps the secret out of logs.
func (h HeaderRule) LogValue() slog.Value {
	return slog.GroupValue(slog.String("domain", h.Domain), slog.String("name", h.Name), slog.String("value", "REDACTED"))
}

// PlaceholderRule gives the sandbox a stand-in for a secret (in environment variable Env); the proxy swaps it for the real value only in requests to Domain.
type PlaceholderRule struct {
	Domain      string `json:"domain"`         // pattern, same syntax as DomainRule.Name
	Env         string `json:"env"`            // env var name, [A-Za-z_][A-Za-z0-9_]*
	Secret      string `json:"secret"`         // secret name
	Placeholder string `json:"placeholder"`    // "corral-placeholder-" + 32 lowercase hex; chosen by the caller (sandbox layer) at create; Normalize validates its form
	Body        bool   `json:"body,omitempty"` // also replace in request bodies
}

// PlaceholderPrefix starts every PlaceholderRule.Placeholder; 32 lower-case
// hexadecimal digits follow it.
const PlaceholderPrefix = "corral-placeholder-"

// LogValue keeps log lines short; a placeholder is not a secret.
func (r PlaceholderRule) LogValue() slog.Value {
	return slog.GroupValue(slog.String("domain", r.Domain), slog.String("env", r.Env), slog.String("secret", r.Secret))
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
		if len(p.Domains)+len(p.CIDRs)+len(p.Headers)+len(p.Placeholders) > 0 {
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
		dom, err := out.ruleDomain(h.Domain)
		if err != nil {
			return Policy{}, err
		}
		if !validHeaderName(h.Name) || strings.ContainsAny(h.Value, "\r\n\x00") {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "header rule for %q: invalid header name or value", h.Domain)
		}
		if _, err := parseTemplate(h.Value); err != nil {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "header rule for %q, header %s: %v", h.Domain, h.Name, err)
		}
		out.Headers = append(out.Headers, HeaderRule{Domain: dom, Name: h.Name, Value: h.Value})
	}
	byEnv := map[string]PlaceholderRule{}
	byPlaceholder := map[string]string{}
	for _, r := range p.Placeholders {
		dom, err := out.ruleDomain(r.Domain)
		if err != nil {
			return Policy{}, err
		}
		switch {
		case !validEnvName(r.Env):
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder rule for %q: env %q: want [A-Za-z_][A-Za-z0-9_]*", r.Domain, r.Env)
		case !validSecretName(r.Secret):
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder rule for %q: secret %q: want [a-z0-9][a-z0-9._-]{0,62}", r.Domain, r.Secret)
		case !validPlaceholder(r.Placeholder):
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder rule for %q: placeholder: want %q followed by 32 lower-case hex digits", r.Domain, PlaceholderPrefix)
		}
		// One env var stands for one secret, whatever the domains it
		// may reach: rules sharing an Env must agree on the rest.
		if prev, ok := byEnv[r.Env]; ok && (prev.Secret != r.Secret || prev.Placeholder != r.Placeholder) {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder rules for env %s name different secrets or placeholders", r.Env)
		}
		if env, ok := byPlaceholder[r.Placeholder]; ok && env != r.Env {
			return Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder rules for env %s and %s share a placeholder", env, r.Env)
		}
		byEnv[r.Env], byPlaceholder[r.Placeholder] = r, r.Env
		out.Placeholders = append(out.Placeholders, PlaceholderRule{Domain: dom, Env: r.Env, Secret: r.Secret, Placeholder: r.Placeholder, Body: r.Body})
	}
	return out, nil
}

// ruleDomain normalizes the domain pattern of a header or placeholder rule
// and checks that the policy's domains allow every name it matches: a rule
// for a name the sandbox cannot reach is a mistake worth reporting. p must
// already hold the normalized domains.
func (p Policy) ruleDomain(pattern string) (string, error) {
	dom, err := normalizePattern(pattern)
	if err != nil {
		return "", err
	}
	if p.Mode == ModeOpen {
		return dom, nil
	}
	rest, wild := strings.CutPrefix(dom, "*.")
	for _, d := range p.Domains {
		// "*.a.b" is covered by "*.a.b" or "*.b"; an exact name covers no
		// wildcard.
		if !wild && matchPattern(d.Name, dom) || wild && strings.HasPrefix(d.Name, "*.") && (d.Name == dom || matchPattern(d.Name, rest)) {
			return dom, nil
		}
	}
	return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "rule for %s: domain not allowed by the policy", pattern)
}

// WithoutStrayRules returns p without the header and placeholder rules
// whose domains p does not allow, and the domains of those it dropped.
// Policies recorded before rules had to name allowed domains may hold
// such rules, which never applied: the proxy refuses those domains.
func (p Policy) WithoutStrayRules() (Policy, []string) {
	var dropped []string
	headers := p.Headers[:0:0]
	for _, h := range p.Headers {
		if _, err := p.ruleDomain(h.Domain); err != nil {
			dropped = append(dropped, h.Domain)
			continue
		}
		headers = append(headers, h)
	}
	placeholders := p.Placeholders[:0:0]
	for _, r := range p.Placeholders {
		if _, err := p.ruleDomain(r.Domain); err != nil {
			dropped = append(dropped, r.Domain)
			continue
		}
		placeholders = append(placeholders, r)
	}
	p.Headers, p.Placeholders = headers, placeholders
	return p, dropped
}

// SecretRefs returns the names of the secrets the policy's header
// templates and placeholders reference, sorted and without duplicates, so
// that callers can check they exist before applying the policy. p must be
// normalized.
func (p Policy) SecretRefs() []string {
	var out []string
	for _, h := range p.Headers {
		parts, _ := parseTemplate(h.Value)
		for _, part := range parts {
			if part.secret != "" {
				out = append(out, part.secret)
			}
		}
	}
	for _, r := range p.Placeholders {
		out = append(out, r.Secret)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// intercepts reports whether some header or placeholder rule applies to
// name, so that the proxy must see its HTTPS requests.
func (p Policy) intercepts(name string) bool {
	n, ok := canonicalName(name)
	if !ok {
		return false
	}
	for _, h := range p.Headers {
		if matchPattern(h.Domain, n) {
			return true
		}
	}
	for _, r := range p.Placeholders {
		if matchPattern(r.Domain, n) {
			return true
		}
	}
	return false
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

// placeholdersFor splits the placeholder rules into those that apply to
// requests for name and the others.
func (p Policy) placeholdersFor(name string) (match, other []PlaceholderRule) {
	n, ok := canonicalName(name)
	for _, r := range p.Placeholders {
		if ok && matchPattern(r.Domain, n) {
			match = append(match, r)
		} else {
			other = append(other, r)
		}
	}
	return match, other
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

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// validSecretName reports whether s matches [a-z0-9][a-z0-9._-]{0,62}.
func validSecretName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && strings.IndexByte("._-", c) >= 0) {
			return false
		}
	}
	return true
}

func validPlaceholder(s string) bool {
	hex, ok := strings.CutPrefix(s, PlaceholderPrefix)
	if !ok || len(hex) != 32 {
		return false
	}
	for i := 0; i < len(hex); i++ {
		if c := hex[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
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
