package server

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
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
// explicitly. Headers are set by the proxy on plaintext HTTP requests to
// the domain; their values are never shown back.
type NetworkPolicy struct {
	// Mode is "none", "allowlist" or "open". Empty means: at create,
	// allowlist when there are rules and the server's default otherwise;
	// in an update, the sandbox's current mode.
	Mode         string       `json:"mode,omitempty"`
	AllowDomains []string     `json:"allow_domains,omitempty"`
	AllowCIDRs   []string     `json:"allow_cidrs,omitempty"`
	Headers      []HeaderRule `json:"headers,omitempty"`
}

// HeaderRule is one header the proxy injects. Value is required in
// requests and always omitted in responses.
type HeaderRule struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	Value  string `json:"value,omitempty"`
}

// policy converts p to the egress policy it names. Syntax errors wrap
// errdefs.ErrInvalidArgument; the Manager checks the rest.
func (p *NetworkPolicy) policy() (egress.Policy, error) {
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
		if h.Value == "" {
			return egress.Policy{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "header %q for %q: a value is required (values are never shown back, so a policy read from the API must be given its values again)", h.Name, h.Domain)
		}
		out.Headers = append(out.Headers, egress.HeaderRule{Domain: h.Domain, Name: h.Name, Value: h.Value})
	}
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

// networkView shows p in the API's form, without header values. Records
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
	p, err := req.policy()
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
