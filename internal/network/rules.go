package network

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/egress"
)

// The ruleset is built in a small intermediate form, a list of rules made
// of conditions and a verdict, that renders both to nftables expressions
// (for the kernel) and to nft syntax (for golden files, logs and humans).
// Every condition loads into register 1 and compares, the way nft(8)
// compiles the same rule.

// cond is one match of a rule.
type cond interface {
	exprs() []expr.Any
	String() string
}

// verdict ends a rule.
type verdict interface {
	exprs() []expr.Any
	String() string
}

type rule struct {
	conds   []cond
	verdict verdict
}

func (r rule) exprs() []expr.Any {
	var out []expr.Any
	for _, c := range r.conds {
		out = append(out, c.exprs()...)
	}
	if r.verdict != nil {
		out = append(out, r.verdict.exprs()...)
	}
	return out
}

func (r rule) String() string {
	var parts []string
	for _, c := range r.conds {
		parts = append(parts, c.String())
	}
	if r.verdict != nil {
		parts = append(parts, r.verdict.String())
	}
	return strings.Join(parts, " ")
}

func r(v verdict, conds ...cond) rule { return rule{conds: conds, verdict: v} }

// --- conditions ---

// notIPv4 matches packets that are not IPv4 (in an inet table: IPv6).
type notIPv4 struct{}

func (notIPv4) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}
func (notIPv4) String() string { return "meta nfproto != ipv4" }

// isIPv4 matches IPv4 packets.
type isIPv4 struct{}

func (isIPv4) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}
func (isIPv4) String() string { return "meta nfproto ipv4" }

// addrMatch matches the IPv4 source or destination against a prefix
// (a single address for /32), or its negation.
type addrMatch struct {
	src    bool
	not    bool
	prefix netip.Prefix
}

func saddrNot(a netip.Addr) cond {
	return addrMatch{src: true, not: true, prefix: netip.PrefixFrom(a, 32)}
}
func saddrIn(p netip.Prefix) cond { return addrMatch{src: true, prefix: p} }
func daddr(a netip.Addr) cond     { return addrMatch{prefix: netip.PrefixFrom(a, 32)} }
func daddrIn(p netip.Prefix) cond { return addrMatch{prefix: p} }

func (m addrMatch) exprs() []expr.Any {
	off := uint32(16) // RFC 791: destination address at byte 16, source at 12
	if m.src {
		off = 12
	}
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	if m.prefix.Bits() < 32 {
		mask := netipMask(m.prefix.Bits())
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}})
	}
	op := expr.CmpOpEq
	if m.not {
		op = expr.CmpOpNeq
	}
	a := m.prefix.Masked().Addr().As4()
	return append(out, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func (m addrMatch) String() string {
	field := "daddr"
	if m.src {
		field = "saddr"
	}
	neg := ""
	if m.not {
		neg = "!= "
	}
	if m.prefix.Bits() == 32 {
		return fmt.Sprintf("ip %s %s%s", field, neg, m.prefix.Addr())
	}
	return fmt.Sprintf("ip %s %s%s", field, neg, m.prefix.Masked())
}

func netipMask(bits int) []byte {
	var m [4]byte
	for i := range bits {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m[:]
}

// l4 matches the transport protocol.
type l4 byte

const (
	tcp = l4(unix.IPPROTO_TCP)
	udp = l4(unix.IPPROTO_UDP)
)

func (p l4) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(p)}},
	}
}

func (p l4) String() string {
	if p == tcp {
		return "meta l4proto tcp"
	}
	return "meta l4proto udp"
}

// dport matches the destination port of TCP or UDP (after an l4 match).
type dport uint16

func (p dport) exprs() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(p))},
	}
}
func (p dport) String() string { return fmt.Sprintf("th dport %d", uint16(p)) }

// ifname matches the input or output interface name, exactly or (with a
// trailing '*') by prefix: comparing only the prefix's bytes is how nft
// compiles a wildcard interface name.
type ifname struct {
	out  bool
	not  bool
	name string
}

func (m ifname) exprs() []expr.Any {
	key := expr.MetaKeyIIFNAME
	if m.out {
		key = expr.MetaKeyOIFNAME
	}
	data := []byte(strings.TrimSuffix(m.name, "*"))
	if !strings.HasSuffix(m.name, "*") {
		data = ifnameKey(m.name)
	}
	op := expr.CmpOpEq
	if m.not {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func (m ifname) String() string {
	field := "iifname"
	if m.out {
		field = "oifname"
	}
	neg := ""
	if m.not {
		neg = "!= "
	}
	return fmt.Sprintf("%s %s%q", field, neg, m.name)
}

// ifnameKey pads an interface name to IFNAMSIZ, the key format of
// ifname-typed sets and exact name compares.
func ifnameKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// ctReply matches packets in the reply direction of their connection:
// packets of connections the host opened.
type ctReply struct{}

func (ctReply) exprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
	}
}
func (ctReply) String() string { return "ct direction reply" }

// ctEstablished matches packets of established or related connections.
type ctEstablished struct{}

func (ctEstablished) exprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}
func (ctEstablished) String() string { return "ct state established,related" }

// --- verdicts ---

type simple expr.VerdictKind

const (
	accept = simple(expr.VerdictAccept)
	drop   = simple(expr.VerdictDrop)
	ret    = simple(expr.VerdictReturn)
)

func (v simple) exprs() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictKind(v)}} }

func (v simple) String() string {
	switch expr.VerdictKind(v) {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	default:
		return "return"
	}
}

// gotoChain continues in another chain without coming back.
type gotoChain string

func (g gotoChain) exprs() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: string(g)}}
}
func (g gotoChain) String() string { return "goto " + string(g) }

// vmap looks the input interface name up in a verdict map: the map's
// element for the interface says which chain to jump to.
type vmap string

func (m vmap) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: string(m), IsDestRegSet: true, DestRegister: 0},
	}
}
func (m vmap) String() string { return "iifname vmap @" + string(m) }

// dnat rewrites the destination to addr:port, or only the address when
// the port is 0.
type dnat netip.AddrPort

func (d dnat) exprs() []expr.Any {
	a := netip.AddrPort(d).Addr().As4()
	if netip.AddrPort(d).Port() == 0 {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: a[:]},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		}
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(netip.AddrPort(d).Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	}
}

func (d dnat) String() string {
	if netip.AddrPort(d).Port() == 0 {
		return "dnat ip to " + netip.AddrPort(d).Addr().String()
	}
	return "dnat ip to " + netip.AddrPort(d).String()
}

// refusePort is where the allowlist sends everything it does not allow: a
// port on the host end nothing is allowed to reach, so the input chain
// refuses the packet with a TCP reset or an ICMP error. That gives the
// sandbox an immediate, clear error while forwarding stays off on its
// interface.
const refusePort = 1

type masquerade struct{}

func (masquerade) exprs() []expr.Any { return []expr.Any{&expr.Masq{}} }
func (masquerade) String() string    { return "masquerade" }

// reject answers with a TCP reset (tcp) or ICMP administratively
// prohibited (anything else), so clients fail at once with a clear error.
type reject bool

func (tcpReset reject) exprs() []expr.Any {
	if tcpReset {
		return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	}
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

func (tcpReset reject) String() string {
	if tcpReset {
		return "reject with tcp reset"
	}
	return "reject with icmpx admin-prohibited"
}

// --- the ruleset ---

// Names of the shared objects in the Manager's table.
const (
	chainPrerouting  = "prerouting"
	chainInput       = "input"
	chainForward     = "forward"
	chainPostrouting = "postrouting"
	chainRefuse      = "refuse"
	mapPre           = "pre"
	mapIn            = "in"
	mapFwd           = "fwd"
)

// chainKind is one of a sandbox's three chains.
type chainKind string

const (
	kindPre chainKind = "pre"
	kindIn  chainKind = "in"
	kindFwd chainKind = "fwd"
)

// sandboxChainKinds lists a sandbox's chains with the verdict map that
// dispatches to each.
func sandboxChainKinds() []struct {
	kind chainKind
	vmap string
} {
	return []struct {
		kind chainKind
		vmap string
	}{{kindPre, mapPre}, {kindIn, mapIn}, {kindFwd, mapFwd}}
}

// sandboxChain names a sandbox's chain: "sb-<id>-<kind>". Reconcile finds
// leftovers by this pattern.
func sandboxChain(id string, kind chainKind) string { return "sb-" + id + "-" + string(kind) }

// baseRules are the shared chains. Each base chain hands a sandbox's
// packets to that sandbox's chain through a verdict map keyed by the
// host-side interface name, so one lookup serves any number of sandboxes
// and packets of other interfaces pass after that one lookup. A sandbox
// interface without a map entry (being set up or torn down) is dropped.
func baseRules(prefix string, subnet netip.Prefix) map[string][]rule {
	wild := prefix + "*"
	return map[string][]rule{
		chainPrerouting: {r(nil, vmap(mapPre))},
		chainInput: {
			r(nil, vmap(mapIn)),
			r(drop, ifname{name: wild}),
		},
		chainForward: {
			r(nil, vmap(mapFwd)),
			r(drop, ifname{name: wild}),
			// Nothing outside opens connections into a sandbox; replies
			// to the sandbox's own forwarded connections pass.
			r(accept, ifname{out: true, name: wild}, ctEstablished{}),
			r(drop, ifname{out: true, name: wild}),
		},
		chainPostrouting: {
			r(masquerade{}, isIPv4{}, saddrIn(subnet), ifname{out: true, not: true, name: wild}),
		},
		chainRefuse: {
			r(reject(true), tcp),
			r(reject(false)),
		},
	}
}

// sandboxRules are the three chains of one sandbox, from its addresses and
// policy. See the package documentation for what they enforce.
func sandboxRules(host, addr netip.Addr, ports egress.Ports, p egress.Policy) map[chainKind][]rule {
	var explicit, broad []egress.CIDRRule
	for _, c := range p.CIDRs {
		if c.Explicit() {
			explicit = append(explicit, c)
		} else {
			broad = append(broad, c)
		}
	}
	return map[chainKind][]rule{
		kindPre: preRules(host, ports, p),
		kindIn:  inRules(host, addr, ports, explicit),
		kindFwd: fwdRules(addr, p.Mode, explicit, broad),
	}
}

// allowCIDR returns the rules that give c's destinations verdict v: one
// for the whole prefix, or one per port and protocol when c names ports.
func allowCIDR(v verdict, c egress.CIDRRule, protos ...l4) []rule {
	if len(c.Ports) == 0 {
		return []rule{r(v, daddrIn(c.Prefix))}
	}
	var out []rule
	for _, port := range c.Ports {
		for _, proto := range protos {
			out = append(out, r(v, daddrIn(c.Prefix), proto, dport(port)))
		}
	}
	return out
}

// preRules is the nat chain: destinations a CIDR rule allows go out
// directly; otherwise DNS goes to the sandbox's resolver and TCP 80/443 to
// the transparent proxy, wherever the sandbox sent them, and in allowlist
// mode everything else to the host end to be refused.
func preRules(host netip.Addr, ports egress.Ports, p egress.Policy) []rule {
	pre := []rule{r(ret, notIPv4{})}
	for _, c := range p.CIDRs {
		pre = append(pre, allowCIDR(ret, c, tcp, udp)...)
	}
	pre = append(pre,
		r(dnat(netip.AddrPortFrom(host, ports.DNS)), udp, dport(53)),
		r(dnat(netip.AddrPortFrom(host, ports.DNS)), tcp, dport(53)),
		r(dnat(netip.AddrPortFrom(host, ports.Transparent)), tcp, dport(80)),
		r(dnat(netip.AddrPortFrom(host, ports.Transparent)), tcp, dport(443)),
	)
	if p.Mode == egress.ModeAllowlist {
		// Nothing else is allowed: send it to the host end to be refused
		// there (see refusePort). Open mode forwards instead, and its
		// forward chain refuses the blocked ranges.
		pre = append(pre,
			r(ret, daddr(host)), // the input chain judges these itself
			r(dnat(netip.AddrPortFrom(host, refusePort)), tcp),
			r(dnat(netip.AddrPortFrom(host, refusePort)), udp),
			r(dnat(netip.AddrPortFrom(host, 0))),
		)
	}
	return pre
}

// inRules is the filter chain for packets to the host itself: only the
// resolver and the proxies on the sandbox's own host address, replies to
// connections the host opened, and host addresses an explicit rule names.
func inRules(host, addr netip.Addr, ports egress.Ports, explicit []egress.CIDRRule) []rule {
	in := []rule{
		r(drop, notIPv4{}),
		r(drop, saddrNot(addr)),
		r(accept, ctReply{}),
		r(accept, daddr(host), udp, dport(ports.DNS)),
		r(accept, daddr(host), tcp, dport(ports.DNS)),
		r(accept, daddr(host), tcp, dport(ports.Transparent)),
		r(accept, daddr(host), tcp, dport(ports.HTTPProxy)),
	}
	for _, c := range explicit {
		in = append(in, allowCIDR(accept, c, tcp, udp)...)
	}
	return append(in, r(gotoChain(chainRefuse)))
}

// fwdRules is the filter chain for packets routed elsewhere: explicit
// rules, then the blocked ranges, then broad rules and open mode.
func fwdRules(addr netip.Addr, mode egress.Mode, explicit, broad []egress.CIDRRule) []rule {
	fwd := []rule{
		r(drop, notIPv4{}),
		r(drop, saddrNot(addr)),
	}
	for _, c := range explicit {
		fwd = append(fwd, allowCIDR(accept, c, tcp, udp)...)
	}
	for _, b := range egress.AlwaysBlocked() {
		fwd = append(fwd, r(gotoChain(chainRefuse), daddrIn(b)))
	}
	for _, c := range broad {
		fwd = append(fwd, allowCIDR(accept, c, tcp, udp)...)
	}
	if mode == egress.ModeOpen {
		fwd = append(fwd, r(accept))
	}
	return append(fwd, r(gotoChain(chainRefuse)))
}

// needsForwarding reports whether a policy sends any traffic through the
// host's routing (CIDR rules or open mode), so forwarding must be enabled
// on the sandbox's host interface.
func needsForwarding(p egress.Policy) bool {
	return p.Mode == egress.ModeOpen || len(p.CIDRs) > 0
}
