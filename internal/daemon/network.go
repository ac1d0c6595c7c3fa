package daemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/tenancy"
)

// Network defaults (Config.NetworkSubnet, NetworkPrefix, NetworkTable).
const (
	DefaultNetworkSubnet = "10.200.0.0/16"
	DefaultNetworkPrefix = "crl"
	DefaultNetworkTable  = "corral"
)

// hostResolvConf is where DNSUpstreams come from when none are given.
const hostResolvConf = "/etc/resolv.conf"

func (c *Config) setNetworkDefaults() error {
	if c.DefaultNetwork == "" {
		c.DefaultNetwork = string(egress.ModeNone)
	}
	if _, err := (egress.Policy{Mode: egress.Mode(c.DefaultNetwork)}).Normalize(); err != nil {
		return fmt.Errorf("default network: %w", err)
	}
	if !c.NetworkSubnet.IsValid() {
		c.NetworkSubnet = netip.MustParsePrefix(DefaultNetworkSubnet)
	}
	if c.NetworkPrefix == "" {
		c.NetworkPrefix = DefaultNetworkPrefix
	}
	if c.NetworkTable == "" {
		c.NetworkTable = DefaultNetworkTable
	}
	return nil
}

// openNetwork starts the egress server (DNS resolver and proxies) and the
// network Manager, which makes or repairs its nftables table. Sandboxes'
// networks are reconciled later, by the sandbox Manager.
func (d *Daemon) openNetwork(context.Context) error {
	ups := d.cfg.DNSUpstreams
	if len(ups) == 0 {
		var err error
		if ups, err = resolvConfServers(hostResolvConf); err != nil {
			return err
		}
		if len(ups) == 0 {
			return fmt.Errorf("no DNS upstream for sandboxes: %s names no nameserver; set --dns-upstream", hostResolvConf)
		}
	}
	// The CA persists with the daemon's state: sandboxes trust it, and a
	// new one would break those that outlive a restart.
	ca, err := egress.LoadCA(filepath.Join(d.cfg.StateDir, "egress-ca"))
	if err != nil {
		return err
	}
	srv, err := egress.New(egress.Config{Upstreams: ups, Ports: egress.DefaultServerPorts(), Logger: d.log.With("component", "egress"), CA: ca,
		Secrets: secrets.Source{Store: d.secrets, Owner: d.sandboxTenant}})
	if err != nil {
		return fmt.Errorf("starting egress server: %w", err)
	}
	d.egress = srv
	d.network, err = network.New(network.Config{
		Subnet:     d.cfg.NetworkSubnet,
		StateDir:   filepath.Join(d.cfg.RunDir, "network"),
		NamePrefix: d.cfg.NetworkPrefix,
		Table:      d.cfg.NetworkTable,
		Egress:     srv,
		Spares:     d.cfg.NetworkSpares,
		Logger:     d.log,
	})
	if err != nil {
		return fmt.Errorf("starting network manager: %w", err)
	}
	d.log.Info("sandbox networks", "subnet", d.cfg.NetworkSubnet.String(), "default_mode", d.cfg.DefaultNetwork,
		"dns_upstreams", fmt.Sprint(ups), "iface_prefix", d.cfg.NetworkPrefix, "nft_table", d.cfg.NetworkTable,
		"spares", d.cfg.NetworkSpares)
	return nil
}

// sandboxTenant returns the tenant that owns sandbox id, for the egress
// proxy's secret lookups.
func (d *Daemon) sandboxTenant(ctx context.Context, id string) (string, error) {
	m := d.owners.Load()
	if m == nil {
		return "", errdefs.Errorf(errdefs.ErrUnavailable, "the daemon is starting")
	}
	sb, err := m.Get(tenancy.AsDaemon(ctx), id)
	return sb.Tenant, err
}

// egressCA is the PEM certificate of the egress proxy's CA, which
// sandboxes trust; nil without networks.
func (d *Daemon) egressCA() []byte {
	if d.network == nil {
		return nil
	}
	if ca := d.network.CA(); ca != nil {
		return ca.CertPEM()
	}
	return nil
}

// closeNetwork releases the network Manager (which keeps its nftables
// table while sandbox networks remain, so that they stay confined) and
// stops the egress server: sandboxes that outlive the daemon have no DNS
// or proxy until the next one adopts them.
func (d *Daemon) closeNetwork(ctx context.Context) {
	if d.network != nil {
		if err := d.network.Close(ctx); err != nil {
			d.log.Error("closing network manager", "err", err)
		}
	}
	if d.egress != nil {
		_ = d.egress.Close()
	}
}

// resolvConfServers returns the nameservers a resolv.conf names, on port
// 53; a missing file names none.
func resolvConfServers(path string) ([]netip.AddrPort, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading DNS servers: %w", err)
	}
	var out []netip.AddrPort
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		// A link-local IPv6 server carries a zone ("fe80::1%eth0"),
		// which egress cannot dial from another namespace anyway.
		if ip, err := netip.ParseAddr(f[1]); err == nil && ip.Zone() == "" {
			out = append(out, netip.AddrPortFrom(ip, 53))
		}
	}
	return out, nil
}

// parseUpstream parses a DNS upstream: an address, with an optional port
// (53 by default): "192.0.2.53", "127.0.0.1:5353", "[2001:db8::1]:53".
func parseUpstream(s string) (netip.AddrPort, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(ip, 53), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("DNS upstream %q: want ADDRESS or ADDRESS:PORT", s)
	}
	return ap, nil
}

// upstreamsFlag collects repeatable (or comma-separated) --dns-upstream
// values.
type upstreamsFlag struct{ v *[]netip.AddrPort }

func (f upstreamsFlag) String() string {
	if f.v == nil {
		return ""
	}
	var s []string
	for _, a := range *f.v {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func (f upstreamsFlag) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		ap, err := parseUpstream(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		*f.v = append(*f.v, ap)
	}
	return nil
}

// prefixFlag is a netip.Prefix flag.
type prefixFlag struct{ v *netip.Prefix }

func (f prefixFlag) String() string {
	if f.v == nil || !f.v.IsValid() {
		return ""
	}
	return f.v.String()
}

func (f prefixFlag) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("want a prefix like %s", DefaultNetworkSubnet)
	}
	*f.v = p
	return nil
}
