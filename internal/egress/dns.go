package egress

import (
	"context"
	"strings"

	"github.com/miekg/dns"
)

// maxAnswerTTL caps the TTL handed to sandboxes, so that they ask again
// (and meet the current policy) at least this often.
const maxAnswerTTL = 60

// ServeDNS answers one query from the sandbox (dns.Handler). It is called
// by the miekg/dns server goroutines of this sandbox, concurrently.
func (sb *sandbox) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := sb.answer(req)
	_ = w.WriteMsg(resp)
}

// answer applies the DNS rules, in this order:
//
//  1. Not a plain query (opcode QUERY, exactly one question, class IN):
//     FORMERR, NOTIMP or REFUSED.
//  2. Mode none: NXDOMAIN for everything.
//  3. Looks like tunneling: REFUSED. That is a query message over 512
//     bytes; a name over Limits.MaxNameLength characters or with a label
//     over Limits.MaxLabelLength; or a type other than A, AAAA, HTTPS and
//     SVCB (TXT, NULL, ANY, MX, SRV, PTR... carry free-form payloads or
//     answer nothing a sandbox needs).
//  4. Name not allowed by the policy: NXDOMAIN, answered here. A name that
//     is not allowed never leaves the host, so it cannot carry data out.
//  5. AAAA, HTTPS, SVCB for an allowed name: an empty NOERROR answer.
//     Sandboxes have no IPv6, and HTTPS records carry address hints and
//     ECH configs the proxy cannot check.
//  6. A for an allowed name: asked upstream as a fresh query; the answer
//     is flattened to A records owned by the question name, with every
//     address that is blocked or the host's own dropped unless an explicit
//     CIDR rule names it (DNS rebinding), and TTLs capped at 60 s.
//
// Limits: length and type rules narrow a DNS tunnel under an allowed
// wildcard to short A queries; they do not close it. A policy that allows
// "*.example.test" trusts whoever runs example.test's name servers.
func (sb *sandbox) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	m.Authoritative = false
	if req.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	p := sb.policy.Load()
	switch {
	case q.Qclass != dns.ClassINET:
		m.Rcode = dns.RcodeRefused
		return m
	case p.Mode == ModeNone:
		m.Rcode = dns.RcodeNameError
		return m
	}
	if reason := sb.tunnelLike(req, name, q.Qtype); reason != "" {
		sb.dnsDecision(name, q.Qtype, false, reason)
		m.Rcode = dns.RcodeRefused
		return m
	}
	if !p.AllowsName(name) {
		sb.dnsDecision(name, q.Qtype, false, "name not allowed")
		m.Rcode = dns.RcodeNameError
		return m
	}
	if q.Qtype != dns.TypeA {
		return m
	}
	select {
	case sb.queries <- struct{}{}:
		defer func() { <-sb.queries }()
	default:
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	ctx, cancel := context.WithTimeout(sb.ctx, 2*queryTimeout)
	defer cancel()
	addrs, ttl, rcode, err := sb.srv.res.lookupA(ctx, name)
	if err != nil {
		sb.srv.log.Warn("dns upstream failed", "sandbox_id", sb.id, "host", name, "error", err)
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	if rcode != dns.RcodeSuccess {
		if rcode != dns.RcodeNameError {
			rcode = dns.RcodeServerFailure
		}
		m.Rcode = rcode
		return m
	}
	var dropped []string
	for _, ip := range addrs {
		if !sb.srv.addrOK(p, ip, 0) {
			dropped = append(dropped, ip.String())
			continue
		}
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: min(ttl, maxAnswerTTL)},
			A:   ip.AsSlice(),
		})
	}
	if len(dropped) > 0 {
		sb.dnsDecision(name, q.Qtype, len(m.Answer) > 0, "dropped blocked addresses "+strings.Join(dropped, ","))
	} else {
		sb.srv.log.Debug("egress decision", "sandbox_id", sb.id, "via", "dns", "host", name, "allowed", true)
	}
	return m
}

// tunnelLike returns why a query looks like a DNS tunnel, or "".
func (sb *sandbox) tunnelLike(req *dns.Msg, name string, qtype uint16) string {
	lim := sb.srv.limits
	if req.Len() > 512 {
		return "query message over 512 bytes"
	}
	if len(name) > lim.MaxNameLength {
		return "name too long"
	}
	for label := range strings.SplitSeq(name, ".") {
		if len(label) > lim.MaxLabelLength {
			return "label too long"
		}
	}
	switch qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
		return ""
	}
	return "query type " + dns.TypeToString[qtype] + " not served"
}

func (sb *sandbox) dnsDecision(name string, qtype uint16, allowed bool, reason string) {
	sb.srv.log.Info("egress decision", "sandbox_id", sb.id, "via", "dns", "host", name,
		"qtype", dns.TypeToString[qtype], "allowed", allowed, "reason", reason)
}
