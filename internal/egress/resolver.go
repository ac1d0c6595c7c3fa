package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// resolver asks the configured upstream resolvers. It builds every query
// itself from a name and a type, so nothing else the sandbox put in its
// query (EDNS options, flags, IDs) reaches an upstream.
type resolver struct {
	upstreams []netip.AddrPort
	udp       *dns.Client
	tcp       *dns.Client
}

// queryTimeout bounds one exchange with one upstream.
const queryTimeout = 2 * time.Second

func newResolver(upstreams []netip.AddrPort) *resolver {
	return &resolver{
		upstreams: upstreams,
		udp:       &dns.Client{Net: "udp", Timeout: queryTimeout, UDPSize: 1232},
		tcp:       &dns.Client{Net: "tcp", Timeout: queryTimeout},
	}
}

var errNoUpstream = errors.New("no upstream resolver configured")

// exchange sends one fresh query for name/qtype to the upstreams in turn
// and returns the first answer (any rcode). It retries over TCP when a UDP
// answer is truncated.
func (r *resolver) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	if len(r.upstreams) == 0 {
		return nil, errNoUpstream
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	q.SetEdns0(1232, false)
	var errs []error
	for _, up := range r.upstreams {
		addr := up.String()
		resp, _, err := r.udp.ExchangeContext(ctx, q, addr)
		if err == nil && resp.Truncated {
			resp, _, err = r.tcp.ExchangeContext(ctx, q, addr)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("resolving %s: %w", name, errors.Join(errs...))
}

// lookupA returns the IPv4 addresses of name (following the CNAME chain
// the upstream returned) and the smallest TTL among the records used.
// A name that does not exist is reported with rcode NXDOMAIN and no error.
func (r *resolver) lookupA(ctx context.Context, name string) (addrs []netip.Addr, ttl uint32, rcode int, err error) {
	resp, err := r.exchange(ctx, name, dns.TypeA)
	if err != nil {
		return nil, 0, 0, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, 0, resp.Rcode, nil
	}
	addrs, ttl = aRecords(resp, dns.Fqdn(name))
	return addrs, ttl, dns.RcodeSuccess, nil
}

// aRecords collects the A records reachable from owner through CNAMEs in
// the answer section; records for other owners are ignored, so an upstream
// cannot smuggle in addresses for names nobody asked about.
func aRecords(resp *dns.Msg, owner string) ([]netip.Addr, uint32) {
	names := map[string]bool{dns.CanonicalName(owner): true}
	ttl := uint32(300)
	// CNAME chains are short; a few passes resolve any order.
	for range 8 {
		grew := false
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && names[dns.CanonicalName(c.Hdr.Name)] && !names[dns.CanonicalName(c.Target)] {
				names[dns.CanonicalName(c.Target)] = true
				ttl = min(ttl, c.Hdr.Ttl)
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok && names[dns.CanonicalName(a.Hdr.Name)] {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
				ttl = min(ttl, a.Hdr.Ttl)
			}
		}
	}
	return out, ttl
}
