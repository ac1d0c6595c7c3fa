package mcp

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	corral "github.com/corralrun/corral/sdk"
)

// network checks the network a client asks for against the policy, the
// most it may have, and returns the policy to create with.
//
// With the operator's mode none, a client may only ask for none; with
// open, for anything but an explicit address rule; with an allowlist, for
// none or an allowlist whose every rule one of the operator's covers: a
// domain rule by the same name or a "*." rule of a parent domain, a CIDR
// rule by a range that holds it, each with the same ports or more.
//
// An explicit address rule (one address, or a range inside an always
// blocked one: private, loopback, link-local with the cloud metadata
// address; egress.CIDRRule.Explicit) opens what no other rule, and not
// mode open, reaches: the daemon's host and its networks. A client's
// explicit rule must therefore lie in an explicit rule of the operator's.
func (s *Server) network(in NetworkIn) (corral.NetworkPolicy, error) {
	ceiling := s.cfg.Policy.Network
	mode := in.Mode
	if mode == "" {
		if len(in.AllowDomains)+len(in.AllowCIDRs) == 0 {
			return ceiling, nil
		}
		mode = corral.NetworkAllowlist
	}
	want := corral.NetworkPolicy{Mode: mode, AllowDomains: in.AllowDomains, AllowCIDRs: in.AllowCIDRs}
	switch mode {
	case corral.NetworkNone:
		if len(in.AllowDomains)+len(in.AllowCIDRs) > 0 {
			return want, invalid("network mode none takes no allow rules")
		}
		return want, nil
	case corral.NetworkAllowlist, corral.NetworkOpen:
	default:
		return want, invalid("network mode %q is not none, allowlist or open", mode)
	}
	switch ceiling.Mode {
	case corral.NetworkOpen:
		for _, c := range in.AllowCIDRs {
			if explicit(c) {
				return want, denied("address rule %q names a single address or a private, loopback or link-local range, which the operator did not open", c)
			}
		}
		return want, nil
	case corral.NetworkAllowlist:
		if mode == corral.NetworkOpen {
			return want, denied("open network is not allowed here; ask for an allowlist within: %s", allowed(ceiling))
		}
		for _, d := range in.AllowDomains {
			if !slicesAny(ceiling.AllowDomains, func(c string) bool { return domainCovers(c, d) }) {
				return want, denied("domain %q is not allowed here; allowed: %s", d, allowed(ceiling))
			}
		}
		for _, c := range in.AllowCIDRs {
			if !slicesAny(ceiling.AllowCIDRs, func(o string) bool { return cidrCovers(o, c) && (explicit(o) || !explicit(c)) }) {
				return want, denied("address range %q is not allowed here; allowed: %s", c, allowed(ceiling))
			}
		}
		return want, nil
	}
	return want, denied("sandboxes here have no network")
}

// checkNetwork fails unless a sandbox with network policy p (that of a
// sandbox to fork) is one a client could have asked for.
func (s *Server) checkNetwork(p *corral.NetworkPolicy) error {
	if p == nil || p.Mode == "" || p.Mode == corral.NetworkNone {
		return nil
	}
	_, err := s.network(NetworkIn{Mode: p.Mode, AllowDomains: p.AllowDomains, AllowCIDRs: p.AllowCIDRs})
	var e *corral.Error
	if errors.As(err, &e) {
		return denied("the sandbox's network is more than sandboxes made here may have: %s", e.Message)
	}
	return err
}

// explicit reports whether a CIDR rule opens addresses that are blocked
// unless named (see network); a rule that does not parse counts as
// explicit.
func explicit(rule string) bool {
	a, _, ok := splitPorts(rule)
	p, err := parsePrefix(a)
	return !ok || err != nil || !p.Addr().Is4() || egress.CIDRRule{Prefix: p}.Explicit()
}

func denied(format string, args ...any) error {
	return &corral.Error{Status: 403, Code: corral.CodePermissionDenied, Message: fmt.Sprintf(format, args...)}
}

// allowed lists an allowlist's rules for an error message.
func allowed(p corral.NetworkPolicy) string {
	rules := append(append([]string(nil), p.AllowDomains...), p.AllowCIDRs...)
	if len(rules) == 0 {
		return "nothing"
	}
	return strings.Join(rules, ", ")
}

func slicesAny(s []string, f func(string) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

// splitPorts splits "HOST:PORT[,PORT...]" into the host and its port set;
// nil ports means the rule's default.
func splitPorts(rule string) (string, map[int]bool, bool) {
	host, list, ok := strings.Cut(rule, ":")
	if !ok {
		return host, nil, true
	}
	ports := map[int]bool{}
	for _, p := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > 65535 {
			return "", nil, false
		}
		ports[n] = true
	}
	return host, ports, true
}

// portsCover reports whether the ports of an operator's rule include a
// client's; nil is the rule kind's default set (def), and a nil def means
// every port.
func portsCover(have, want, def map[int]bool) bool {
	if have == nil {
		have = def
	}
	if want == nil {
		want = def
	}
	if have == nil {
		return true
	}
	if want == nil {
		return false
	}
	for p := range want {
		if !have[p] {
			return false
		}
	}
	return true
}

// webPorts are the ports of a domain rule that names none.
var webPorts = map[int]bool{80: true, 443: true}

// domainCovers reports whether the operator's domain rule c covers the
// client's rule d: the same name or a subdomain of a "*." rule.
func domainCovers(c, d string) bool {
	cn, cp, ok1 := splitPorts(strings.ToLower(c))
	dn, dp, ok2 := splitPorts(strings.ToLower(d))
	if !ok1 || !ok2 || !portsCover(cp, dp, webPorts) {
		return false
	}
	cn, dn = strings.TrimSuffix(cn, "."), strings.TrimSuffix(dn, ".")
	if cn == dn {
		return true
	}
	if parent, ok := strings.CutPrefix(cn, "*."); ok {
		return strings.HasSuffix(strings.TrimPrefix(dn, "*."), "."+parent)
	}
	return false
}

// cidrCovers reports whether the operator's CIDR rule c holds the client's
// rule d (a rule without ports allows every port).
func cidrCovers(c, d string) bool {
	ca, cp, ok1 := splitPorts(c)
	da, dp, ok2 := splitPorts(d)
	if !ok1 || !ok2 || !portsCover(cp, dp, nil) {
		return false
	}
	cpfx, err1 := parsePrefix(ca)
	dpfx, err2 := parsePrefix(da)
	return err1 == nil && err2 == nil && cpfx.Bits() <= dpfx.Bits() && cpfx.Contains(dpfx.Addr())
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
