package vmguest

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Network is the guest's one link to the host: the address the sandbox's
// network namespace gave its veth, which the VM takes over.
type Network struct {
	// Addr is the guest's IPv4 address with its prefix length.
	Addr netip.Prefix
	// Gateway is the default route's next hop.
	Gateway netip.Addr
	// MTU of the link; 0 keeps the driver's.
	MTU int
}

// String formats n as ParseNetwork reads it: ADDR/BITS,GATEWAY[,MTU].
func (n Network) String() string {
	s := n.Addr.String() + "," + n.Gateway.String()
	if n.MTU > 0 {
		s += "," + strconv.Itoa(n.MTU)
	}
	return s
}

// ParseNetwork reads ADDR/BITS,GATEWAY[,MTU] (IPv4).
func ParseNetwork(s string) (Network, error) {
	parts := strings.Split(s, ",")
	if len(parts) < 2 || len(parts) > 3 {
		return Network{}, fmt.Errorf("network %q: want ADDR/BITS,GATEWAY[,MTU]", s)
	}
	var n Network
	var err error
	if n.Addr, err = netip.ParsePrefix(parts[0]); err != nil || !n.Addr.Addr().Is4() {
		return Network{}, fmt.Errorf("network %q: bad IPv4 address %q", s, parts[0])
	}
	if n.Gateway, err = netip.ParseAddr(parts[1]); err != nil || !n.Gateway.Is4() {
		return Network{}, fmt.Errorf("network %q: bad IPv4 gateway %q", s, parts[1])
	}
	if len(parts) == 3 {
		if n.MTU, err = strconv.Atoi(parts[2]); err != nil || n.MTU < 68 {
			return Network{}, fmt.Errorf("network %q: bad MTU %q", s, parts[2])
		}
	}
	return n, nil
}

// netDevice is the guest's only network interface.
const netDevice = "eth0"

// configure brings up netDevice with n's address and default route,
// through the ioctls that ifconfig and route(8) use.
func (n Network) configure() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening socket for network ioctls: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(netDevice)
	if err != nil {
		return err
	}
	addr := n.Addr.Addr().As4()
	if err := ifr.SetInet4Addr(addr[:]); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
		return fmt.Errorf("setting address of %s: %w", netDevice, err)
	}
	var mask [4]byte
	for i := 0; i < n.Addr.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	if err := ifr.SetInet4Addr(mask[:]); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
		return fmt.Errorf("setting netmask of %s: %w", netDevice, err)
	}
	if n.MTU > 0 {
		ifr.SetUint32(uint32(n.MTU))
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFMTU, ifr); err != nil {
			return fmt.Errorf("setting MTU of %s: %w", netDevice, err)
		}
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading flags of %s: %w", netDevice, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up %s: %w", netDevice, err)
	}
	return addDefaultRoute(fd, n.Gateway)
}

// rtentry is struct rtentry of <linux/route.h> on 64-bit Linux, the
// argument of SIOCADDRT.
type rtentry struct {
	pad1    uint64
	dst     unix.RawSockaddrInet4
	gateway unix.RawSockaddrInet4
	genmask unix.RawSockaddrInet4
	flags   uint16
	pad2    int16
	pad3    uint64
	pad4    uintptr
	metric  int16
	dev     uintptr
	mtu     uint64
	window  uint64
	irtt    uint16
}

// addDefaultRoute adds "default via gw": RTF_UP|RTF_GATEWAY with a zero
// destination and mask.
func addDefaultRoute(fd int, gw netip.Addr) error {
	rt := rtentry{flags: unix.RTF_UP | unix.RTF_GATEWAY}
	rt.dst.Family = unix.AF_INET
	rt.genmask.Family = unix.AF_INET
	rt.gateway.Family = unix.AF_INET
	rt.gateway.Addr = gw.As4()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt))); errno != 0 {
		return fmt.Errorf("adding default route via %s: %w", gw, errno)
	}
	return nil
}
