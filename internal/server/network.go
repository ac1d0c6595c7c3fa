package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/secrets"
)

// NetworkPolicy is a sandbox's network policy as the API reads and shows
// it: the body of PUT /v1/sandboxes/{id}/network and the "network" of a
// create request and of a sandbox.
//
// Rules are strings. A domain is "NAME" or "NAME:PORT[,PORT...]", where
// NAME may start with "*." (every name below it) and the ports default to
// 80 and 443. A CIDR is "ADDRESS[/BITS]" or "ADDRESS[/BITS]:PORT[,PORT...]"
// (IPv4; without ports every port and protocol); a rule inside a private,
// loopback or link-local range, or naming one address, opens it
// explicitly. Headers are set by the proxy on requests to the domain;
// their values, which may name the tenant's secrets as {{secret:NAME}},
// are never shown back. Placeholders give the sandbox an environment
// variable holding a stand-in for a secret, which the proxy swaps for the
// secret on requests to the domain.
type NetworkPolicy struct {
	// Mode is "none", "allowlist" or "open". Empty means: at create,
	// allowlist when there are rules and the server's default otherwise;
	// in an update, the sandbox's current mode.
	Mode         string            `json:"mode,omitempty"`
	AllowDomains []string          `json:"allow_domains,omitempty"`
	AllowCIDRs   []string          `json:"allow_cidrs,omitempty"`
	Headers      []HeaderRule      `json:"headers,omitempty"`
	Placeholders []PlaceholderRule `json:"placeholders,omitempty"`
}

// HeaderRule is one header the proxy injects. Value is required at create
// and always omitted in responses; an update without it keeps the
// sandbox's value for the same domain and header.
type HeaderRule struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	Value  string `json:"value,omitempty"`
}

// PlaceholderRule puts a stand-in for the tenant's secret Secret in the
// sandbox's environment variable Env; the proxy replaces the stand-in
// with the secret in requests to Domain (headers, and with Body the body
// too). The stand-in is made by the daemon; no response holds the secret.
type PlaceholderRule struct {
	Domain string `json:"domain"`
	Env    string `json:"env"`
	Secret string `json:"secret"`
	Body   bool   `json:"body,omitempty"`
}

// validEnvName is what a placeholder's environment variable looks like:
// a POSIX shell name.
var validEnvName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// toEgressPlaceholders checks placeholder rules and converts them for the
// egress policy; the Manager makes their stand-ins. Syntax errors wrap
// errdefs.ErrInvalidArgument.
func toEgressPlaceholders(rules []PlaceholderRule) ([]egress.PlaceholderRule, error) {
	var out []egress.PlaceholderRule
	for _, r := range rules {
		if r.Domain == "" || strings.Contains(r.Domain, ":") {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder %s: domain %q: want a name pattern without ports", r.Env, r.Domain)
		}
		if !validEnvName.MatchString(r.Env) {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "placeholder env %q: want a variable name (letters, digits and '_', not starting with a digit)", r.Env)
		}
		if err := secrets.CheckName(r.Secret); err != nil {
			return nil, fmt.Errorf("placeholder %s: %w", r.Env, err)
		}
		out = append(out, egress.PlaceholderRule{Domain: r.Domain, Env: r.Env, Secret: r.Secret, Body: r.Body})
	}
	return out, nil
}

// policy converts p to the egress policy it names. At create (update
// false) every header needs a value; in an update the Manager keeps the
// sandbox's value for a header sent without one. Syntax errors wrap
// errdefs.ErrInvalidArgument; the Manager checks the rest.
func (p *NetworkPolicy) policy(update bool) (egress.Policy, error) {
	if p == nil {
		return egress.Policy{}, nil
	}
	out := egress.Policy{Mode: egress.Mode(p.Mode)}
	for _, d := range p.AllowDomains {
		name, ports, err := splitPorts(d)
		if err != nil {
			return egress.Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "allow_domains %q: %v", d, err)
		}
		out.Domains = append(out.Domains, egress.DomainRule{Name: name, Ports: ports})
	}
	for _, c := range p.AllowCIDRs {
		rule, err := parseCIDRRule(c)
		if err != nil {
			return egress.Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "allow_cidrs %q: %v", c, err)
		}
		out.CIDRs = append(out.CIDRs, rule)
	}
	for _, h := range p.Headers {
		if h.Value == "" && !update {
			return egress.Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "header %q for %q: a value is required (values are never shown back, so a policy read from the API must be given its values again)", h.Name, h.Domain)
		}
		out.Headers = append(out.Headers, egress.HeaderRule{Domain: h.Domain, Name: h.Name, Value: h.Value})
	}
	placeholders, err := toEgressPlaceholders(p.Placeholders)
	if err != nil {
		return egress.Policy{}, err
	}
	out.Placeholders = placeholders
	return out, nil
}

// parseCIDRRule parses "ADDRESS[/BITS][:PORT[,PORT...]]".
func parseCIDRRule(s string) (egress.CIDRRule, error) {
	if strings.Count(s, ":") > 1 {
		return egress.CIDRRule{}, errors.New("IPv6 is not supported")
	}
	addr, ports, err := splitPorts(s)
	if err != nil {
		return egress.CIDRRule{}, err
	}
	var prefix netip.Prefix
	if strings.Contains(addr, "/") {
		prefix, err = netip.ParsePrefix(addr)
	} else {
		var ip netip.Addr
		if ip, err = netip.ParseAddr(addr); err == nil {
			prefix = netip.PrefixFrom(ip, ip.BitLen())
		}
	}
	if err != nil {
		return egress.CIDRRule{}, errors.New("want ADDRESS[/BITS][:PORT[,PORT...]]")
	}
	return egress.CIDRRule{Prefix: prefix, Ports: ports}, nil
}

// splitPorts splits "X" or "X:PORT[,PORT...]".
func splitPorts(s string) (string, []uint16, error) {
	x, list, ok := strings.Cut(s, ":")
	if x == "" {
		return "", nil, errors.New("empty rule")
	}
	if !ok {
		return x, nil, nil
	}
	var ports []uint16
	for p := range strings.SplitSeq(list, ",") {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return "", nil, errors.New("ports are numbers from 1 to 65535, separated by commas")
		}
		ports = append(ports, uint16(n))
	}
	return x, ports, nil
}

// networkView shows p in the API's form, without header values or
// placeholders' stand-ins (which only the sandbox needs). Records
// made before networks have no mode and no view.
func networkView(p egress.Policy) *NetworkPolicy {
	if p.Mode == "" {
		return nil
	}
	v := &NetworkPolicy{Mode: string(p.Mode)}
	for _, d := range p.Domains {
		v.AllowDomains = append(v.AllowDomains, d.Name+joinPorts(d.Ports))
	}
	for _, c := range p.CIDRs {
		v.AllowCIDRs = append(v.AllowCIDRs, c.Prefix.String()+joinPorts(c.Ports))
	}
	for _, h := range p.Headers {
		v.Headers = append(v.Headers, HeaderRule{Domain: h.Domain, Name: h.Name})
	}
	for _, r := range p.Placeholders {
		v.Placeholders = append(v.Placeholders, PlaceholderRule{Domain: r.Domain, Env: r.Env, Secret: r.Secret, Body: r.Body})
	}
	return v
}

func joinPorts(ports []uint16) string {
	if len(ports) == 0 {
		return ""
	}
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return ":" + strings.Join(s, ",")
}

// updateNetwork replaces a sandbox's network policy live.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var req NetworkPolicy
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := req.policy(true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.m.UpdateNetwork(r.Context(), r.PathValue("id"), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(sb))
}
