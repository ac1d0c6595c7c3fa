// Package network gives each sandbox its own network namespace with a veth
// pair to the host, addresses from a configured private range, and
// host-side nftables rules, and tears all of it down without leaks. It
// enforces nothing by itself inside the sandbox: rules live on the host,
// where neither runc nor gVisor workloads can change them.
package network

import (
	_ "github.com/google/nftables"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
)
