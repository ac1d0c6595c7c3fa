// Package egress decides and carries a sandbox's outbound traffic: a DNS
// resolver that answers only allowed names and a proxy that reads the TLS
// SNI or HTTP Host (or a CONNECT target), checks the policy, and dials the
// name itself.
//
// It owns the Policy type and its matcher, and a Server that listens on
// each sandbox's host address. It does not create interfaces or firewall
// rules: package network does, and sends the sandbox's DNS and TCP 80/443
// here with nftables.
//
// # Decisions
//
// Every DNS query, proxied connection and plaintext HTTP request reads the
// sandbox's current policy (an atomic pointer), so Server.SetPolicy takes
// effect for the next one; spliced connections already open keep running.
// Each decision is logged with sandbox_id, via, host and allowed.
//
//   - DNS: see sandbox.answer for the exact rules. Names the policy does
//     not allow get NXDOMAIN without leaving the host; TXT, ANY and other
//     free-form types, long names and long labels get REFUSED; answers
//     lose every address that is blocked or the host's own (DNS
//     rebinding).
//   - TLS (transparent, port 443): the SNI of the ClientHello is the
//     destination. TLS is never terminated. A hello without SNI is judged
//     by the address the sandbox dialed, which only a CIDR rule or open
//     mode allows. Refusals get a TLS access_denied alert.
//   - Plain HTTP (transparent, port 80, and the explicit proxy): the Host
//     header (the URI's authority for absolute-form requests) of every
//     request is the destination, so a keep-alive connection cannot switch
//     hosts. Refusals get a 403 with a body naming the policy.
//   - CONNECT (explicit proxy): the target host:port is the destination;
//     if the tunnel carries TLS, its SNI must be allowed as well.
//
// The proxy always resolves the name itself (through the configured
// upstreams) and connects to an address that is neither blocked nor the
// host's own, unless an explicit CIDR rule names it; it never connects to
// the address the sandbox chose. IP literals are dialed only when the
// policy allows the address itself.
//
// # Limits
//
//   - Domain fronting: inside TLS the Host header is invisible. A sandbox
//     allowed to reach a CDN name can ask that CDN for another site; the
//     connection still goes only to the allowed name's addresses.
//   - Encrypted Client Hello: only the outer SNI is visible, and it is
//     what gets checked.
//   - Secrets (Policy.Headers) are injected only into plaintext HTTP
//     requests. HTTPS would need TLS interception with a per-sandbox CA,
//     which this package does not do.
//   - DNS tunnels under an allowed wildcard are narrowed (A queries, short
//     labels), not closed: allowing *.example.test trusts example.test's
//     name servers.
//   - The proxy resolves A records only; IPv6-only destinations fail.
package egress
