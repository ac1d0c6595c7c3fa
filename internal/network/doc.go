// Package network gives each sandbox its own network namespace with a veth
// pair to the host, addresses from a configured private range, and
// host-side nftables rules, and tears all of it down without leaks. It
// enforces nothing inside the sandbox: rules live on the host, where
// neither runc nor gVisor workloads can change them (gVisor's netstack
// would bypass rules inside the namespace anyway).
//
// # Layout
//
// A sandbox gets a namespace bind-mounted at <StateDir>/netns/<id> (the
// path runc and runsc join). In mode none that is all: loopback only. In
// the other modes it also gets a veth pair: the host end <prefix><slot>
// in the root namespace (its alias holds the sandbox id) and eth0 inside,
// a /30 of the subnet (host .1, sandbox .2), and a default route via the
// host end. IPv6 is disabled inside the namespace and on the host end, and
// filtered as well.
//
// The Manager owns one nftables table (family inet). Base chains on
// prerouting, input and forward look the input interface up in verdict
// maps and jump to the sandbox's own chains (sb-<id>-pre, -in, -fwd), so
// packets of other interfaces cost one hash lookup per hook whatever the
// number of sandboxes. An interface with the prefix but no map entry (in
// the middle of setup or teardown) is dropped. testdata/ruleset.golden
// shows the full ruleset for a few policies.
//
// # What the rules enforce
//
//   - DNS (UDP and TCP port 53, to any address) goes to the sandbox's
//     resolver on its host end; TCP 80 and 443 (to any address) go to the
//     transparent proxy. The egress package decides by name there.
//   - The host itself is reachable only on the resolver and proxy ports of
//     the sandbox's own host end; replies to connections the host opened
//     pass.
//   - Destinations a CIDR rule allows skip the proxy and are forwarded
//     (and masqueraded). A rule inside an always-blocked range, or naming
//     a single address, opens that range explicitly; a broader rule does
//     not.
//   - Always blocked otherwise: the host's own addresses, loopback,
//     private (10/8, 172.16/12, 192.168/16), CGNAT (100.64/10), link-local
//     with 169.254.169.254, multicast, reserved, other sandboxes (the
//     subnet must be private), and all IPv6.
//   - Allowlist mode sends everything else to the host end, where it is
//     refused with a TCP reset or an ICMP error: sandboxes fail at once
//     with a clear error, and forwarding stays off on their interface
//     unless CIDR rules need it. Open mode forwards all other traffic to
//     non-blocked addresses; the host then needs forwarding and a route
//     out on its uplink, which this package does not configure.
//   - Spoofed source addresses are dropped; nothing outside can open a
//     connection into a sandbox.
//
// # Lifecycle
//
// Setup builds everything and rolls back fully on any failure; Update
// rewrites a sandbox's chains in one atomic batch and re-points its
// egress; Teardown removes everything and is idempotent. List and
// Reconcile find networks of a previous daemon by the namespace files,
// interface aliases and chain names, adopt the ones still wanted and
// remove the rest. DialLoopback lets the daemon itself connect to a
// sandbox's port (inbound forwarding) on 127.0.0.1 inside the namespace.
//
// Removing a veth sandbox's chains and veth waits on the kernel's RCU: an
// nftables commit that deletes anything waits one grace period, and
// unregistering a veth waits in rcu_barrier. So Teardown does only the
// quick part, which cuts the sandbox off (egress detached, namespace
// unmounted), and leaves the rest to a background batch (reap.go): one
// nftables commit per batch of sandboxes, and the kernel deletes both veth
// ends in its own batched namespace cleanup.
package network
