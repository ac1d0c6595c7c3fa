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
//     destination. TLS is spliced, not terminated, except for the names
//     below. A hello without SNI is judged by the address the sandbox
//     dialed, which only a CIDR rule or open mode allows. Refusals get a
//     TLS access_denied alert.
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
// # Header and placeholder rules
//
// Policy.Headers set headers, and Policy.Placeholders swap a stand-in the
// sandbox holds for a secret's value, in requests to their domains. Header
// values may reference secrets as {{secret:NAME}}; every reference is
// resolved through Config.Secrets for each request, and a failure answers
// 502 naming the secret. A placeholder seen in a request to another host
// is sent unchanged and logged as a warning.
//
// Plaintext requests are always visible. For HTTPS, when Config.CA is set
// and the SNI (transparent or inside a CONNECT tunnel) is allowed and
// matches a rule's domain, the proxy terminates the sandbox's TLS with a
// leaf certificate for that name signed by the CA, offering HTTP/2 and
// HTTP/1.1. Every request inside must name the same host (else 421). Each
// is forwarded over the proxy's own TLS connection to the name, resolved
// and dialed as above and verified against Config.UpstreamRoots; an
// invalid certificate fails the request with 502 and is never passed on.
// Decisions on intercepted connections and requests are logged with
// intercepted=true.
//
// # Limits
//
//   - Domain fronting: inside spliced TLS the Host header is invisible.
//     A sandbox allowed to reach a CDN name can ask that CDN for another
//     site; the connection still goes only to the allowed name's
//     addresses. Intercepted connections check every Host.
//   - Encrypted Client Hello: only the outer SNI is visible, and it is
//     what gets checked.
//   - Interception covers only names that header or placeholder rules
//     apply to, and only sandboxes that trust the CA. A client that pins
//     its server's certificate (or ignores the system trust store) fails
//     its handshake with the proxy: it fails closed and gets no secret.
//     Everything else stays end to end; HTTP/3 runs over UDP, which the
//     proxy does not carry at all.
//   - Secrets never enter the sandbox, but the sandbox can still use them
//     through the proxy while it runs: any request to a rule's domain
//     carries them. Rules bound where a secret goes, not what is done with
//     it there.
//   - Placeholders are swapped in header values, and in bodies only where
//     the rule asks (Body); in URLs never. A body that may change is sent
//     chunked (HTTP/1.1) or without a declared length (HTTP/2).
//   - On intercepted connections WebSocket works as an HTTP/1.1 upgrade;
//     CONNECT requests inside them (HTTP/2 extended CONNECT, RFC 8441,
//     among them) are refused.
//   - DNS tunnels under an allowed wildcard are narrowed (A queries, short
//     labels), not closed: allowing *.example.test trusts example.test's
//     name servers.
//   - The proxy resolves A records only; IPv6-only destinations fail.
package egress
