package vm

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/vmguest"
)

// Names of the devices the driver makes in a sandbox's network namespace.
const (
	tapDevice    = "tap0"
	bridgeDevice = "br0"
)

// plugNetwork gives the VM the sandbox's link to the host, in the
// network namespace n the daemon prepared. That namespace has loopback
// only (network mode none: the VM gets no network device, and nil is
// returned) or one link, the sandbox's end of a veth pair with an IPv4
// address and a default route. The VM takes over that address: the link
// and a new tap device, QEMU's end of the guest's NIC, become ports of a
// bridge, and the address moves to the guest. So the host side (address,
// routes, nftables rules, DNS filter and proxy) is what it is for every
// other runtime.
func plugNetwork(n *driver.Network) (*vmguest.Network, error) {
	if n == nil {
		return nil, nil
	}
	var guest *vmguest.Network
	err := ocirt.InNetNS(n.NetNSPath, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("listing links: %w", err)
		}
		var eth netlink.Link
		for _, l := range links {
			if l.Attrs().Flags&net.FlagLoopback != 0 {
				continue
			}
			if eth != nil {
				return errdefs.Errorf(errdefs.ErrFailedPrecondition, "the network namespace has more than one link (%s, %s)", eth.Attrs().Name, l.Attrs().Name)
			}
			eth = l
		}
		if eth == nil {
			return nil
		}
		g, err := guestAddress(eth)
		if err != nil {
			return err
		}
		if err := bridge(eth, g.Addr); err != nil {
			return err
		}
		guest = &g
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("giving the VM its network: %w", err)
	}
	return guest, nil
}

// guestAddress reads the IPv4 address, default gateway and MTU of link.
func guestAddress(link netlink.Link) (vmguest.Network, error) {
	name := link.Attrs().Name
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		return vmguest.Network{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "link %s: want one IPv4 address, have %d (%v)", name, len(addrs), err)
	}
	routes, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return vmguest.Network{}, fmt.Errorf("listing routes of %s: %w", name, err)
	}
	var gw netip.Addr
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
			gw, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	if !gw.IsValid() {
		return vmguest.Network{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "link %s has no default route", name)
	}
	ip, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	bits, _ := addrs[0].Mask.Size()
	return vmguest.Network{Addr: netip.PrefixFrom(ip, bits), Gateway: gw, MTU: link.Attrs().MTU}, nil
}

// bridge moves addr off link and joins link and a new persistent tap
// device in a bridge, all up.
func bridge(link netlink.Link, addr netip.Prefix) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeDevice, MTU: link.Attrs().MTU}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("adding bridge: %w", err)
	}
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: tapDevice, MTU: link.Attrs().MTU}, Mode: netlink.TUNTAP_MODE_TAP}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("adding tap device: %w", err)
	}
	a, err := netlink.ParseAddr(addr.String())
	if err != nil {
		return err
	}
	if err := netlink.AddrDel(link, a); err != nil {
		return fmt.Errorf("moving address %s off %s: %w", addr, link.Attrs().Name, err)
	}
	for _, l := range []netlink.Link{link, tap} {
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("adding %s to the bridge: %w", l.Attrs().Name, err)
		}
	}
	for _, l := range []netlink.Link{br, tap, link} {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing up %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// guestMAC is the MAC address of sandbox id's NIC: locally administered,
// unicast, derived from the ID so that it is stable for the sandbox.
func guestMAC(id string) string {
	sum := sha256.Sum256([]byte(id))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
}
