package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/mcp"
	"github.com/corralrun/corral/internal/sandbox"
)

// Config is everything the daemon needs. Zero values take the defaults
// documented on each field.
type Config struct {
	// StateDir holds the database, storage, templates and snapshots
	// (default /var/lib/corral).
	StateDir string
	// RunDir holds what the drivers and the network keep of running
	// sandboxes: OCI bundles, agent sockets and logs, runc's and runsc's
	// state, network namespace mounts and name service files (default
	// DefaultRunDir(StateDir), on the /run tmpfs). None of it outlives the
	// host's processes, and its files are made and removed in every create
	// and delete, which a tmpfs does without touching a disk. A state dir
	// that itself holds such state of running sandboxes is used as the run
	// dir until none is left, so that those sandboxes stay managed.
	RunDir string
	// Socket is the root-only unix socket of the API
	// (default /run/corral/corral.sock).
	Socket string
	// Listen, when set, also serves the API on this TCP address; APIKey is
	// then required.
	Listen string
	APIKey string
	// NoMCP turns off the MCP endpoint, which is served at /mcp on Listen
	// behind APIKey; MCP is what MCP clients there may do.
	NoMCP bool
	MCP   mcp.Policy
	// E2BListen, when set, serves the E2B-compatible API on this TCP
	// address (point E2B_API_URL and E2B_SANDBOX_URL at it); APIKey is
	// then required. E2BDomain is the sandbox domain that API reports, for
	// a TLS proxy with a wildcard name in front of it (optional).
	E2BListen string
	E2BDomain string
	// E2BBuildNetwork is the network mode (none, allowlist or open) of
	// the RUN steps of templates built through the E2B API, which cannot
	// ask for one; E2BBuildDomains are the names an allowlist lets
	// through. The default is none, as for any build.
	E2BBuildNetwork string
	E2BBuildDomains []string
	// Storage is "btrfs" (default) or "overlay".
	Storage string
	// BtrfsImageSize is the size of the sparse loop image used when the
	// state dir is not on btrfs (default 20 GiB).
	BtrfsImageSize int64
	// BtrfsQuotaMode is how btrfs storage accounts disk limits: "simple"
	// (default) or "full" (see btrfs.Config.QuotaMode).
	BtrfsQuotaMode string
	// Runtime is the default runtime (default "runc").
	Runtime string
	// Runtimes are the runtimes to offer besides runc, which is always
	// there: "gvisor", "vm". Empty means each of them that `corral doctor`
	// finds usable on this host (see openGVisor, openVM).
	Runtimes []string
	// RunscPath is the runsc binary (default: from PATH) and
	// GVisorPlatform gVisor's platform (default systrap).
	RunscPath, GVisorPlatform string
	// RuncPath is the runc binary (default: from PATH).
	RuncPath string
	// AgentPath is the static binary run as the in-sandbox agent
	// (default: DefaultAgent).
	AgentPath string
	// CgroupParent holds one cgroup per sandbox (default "/corral").
	CgroupParent string
	// Defaults fill the resource limits a create leaves out (DefaultLimits()
	// when entirely zero) and Max bounds them (zero fields: no bound). A
	// default disk limit needs btrfs storage.
	Defaults, Max sandbox.Limits
	// OpenFiles is RLIMIT_NOFILE of every sandbox process
	// (runc.DefaultOpenFiles when zero).
	OpenFiles uint64
	// NoUserNamespaces builds new templates for sandboxes without user
	// namespaces, whose root is host root (confined by capabilities,
	// seccomp and namespaces only). Templates built with them keep them.
	NoUserNamespaces           bool
	DefaultTimeout, MaxTimeout time.Duration
	// AllowMounts are the host directories beneath which sandboxes may
	// mount host directories (corral server --allow-mount DIR), absolute
	// paths; with none, every create with mounts is refused.
	AllowMounts []string
	// DefaultNetwork is the network mode of sandboxes that name neither a
	// mode nor rules: "none" (default), "allowlist" or "open".
	DefaultNetwork string
	// NetworkSubnet holds sandboxes' addresses, a /30 each
	// (DefaultNetworkSubnet when zero). NetworkPrefix starts the names of
	// their host-side interfaces (DefaultNetworkPrefix) and NetworkTable
	// names the nftables table (DefaultNetworkTable). The daemon owns
	// all three: a second daemon on the host needs its own.
	NetworkSubnet               netip.Prefix
	NetworkPrefix, NetworkTable string
	// NetworkSpares is how many networks of each kind (mode none, and
	// with a veth) are made ahead for creates to take (network.Config;
	// 0: none). UserNSSpares is the same for user namespaces of runc
	// sandboxes (runc.Config).
	NetworkSpares, UserNSSpares int
	// DNSUpstreams answer the lookups sandboxes' policies allow
	// (default: the nameservers of the host's /etc/resolv.conf).
	DNSUpstreams []netip.AddrPort
	// ExecOutput and MaxExecOutput cap one exec's streamed output: the
	// default cap (0: 64 MiB, negative: none) and the most a request may
	// ask for (0: no maximum).
	ExecOutput, MaxExecOutput int64
	// Admission bounds the sandboxes the daemon accepts: host capacity,
	// per API key limits, starting slots and their wait queue
	// (admission.Config; zero: none, while `corral server` bounds the
	// starting slots by default).
	Admission admission.Config
	// Pools are warm pools defined (or changed) at every start, next to
	// those defined through the API, which the store keeps.
	// PoolConcurrency bounds the pool sandboxes made at once (default 2);
	// PoolRefillDelay is how long a pool waits after a claim before it
	// replaces the member (sandbox.Config).
	Pools           []sandbox.Pool
	PoolConcurrency int
	PoolRefillDelay time.Duration
	// Webhooks are URLs (http or https) that each get every sandbox
	// lifecycle event in a POST (package webhook); WebhookSecret, when
	// set, signs them all.
	Webhooks      []string
	WebhookSecret string
	// ClusterEtcd, when set, are the etcd endpoints of the cluster this
	// node joins (package cluster) as NodeName, reachable by the other
	// nodes at Advertise (HOST:PORT); all three or none. ClusterRefresh
	// is how often the node's record is rewritten (default
	// cluster.DefaultRefresh).
	ClusterEtcd         []string
	NodeName, Advertise string
	ClusterRefresh      time.Duration
	Version             string
	Logger              *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.StateDir == "" {
		c.StateDir = "/var/lib/corral"
	}
	if c.Socket == "" {
		c.Socket = "/run/corral/corral.sock"
	}
	if c.Storage == "" {
		c.Storage = "btrfs"
	}
	if c.Runtime == "" {
		c.Runtime = "runc"
	}
	if c.Defaults == (sandbox.Limits{}) {
		c.Defaults = DefaultLimits()
	}
	if err := c.checkRuntimes(); err != nil {
		return err
	}
	if err := checkLimits(c.Defaults, c.Max); err != nil {
		return err
	}
	if err := c.checkAllowMounts(); err != nil {
		return err
	}
	if err := c.checkWebhooks(); err != nil {
		return err
	}
	if err := c.checkCluster(); err != nil {
		return err
	}
	if c.Defaults.DiskBytes > 0 && c.Storage != "btrfs" {
		return fmt.Errorf("a default disk limit needs btrfs storage: %s cannot enforce one", c.Storage)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.AgentPath == "" {
		agent, err := DefaultAgent(c.Logger)
		if err != nil {
			return err
		}
		c.AgentPath = agent
	}
	if err := c.setNetworkDefaults(); err != nil {
		return err
	}
	switch egress.Mode(c.E2BBuildNetwork) {
	case "", egress.ModeNone, egress.ModeOpen, egress.ModeAllowlist:
	default:
		return fmt.Errorf("--e2b-build-network %q: want none, allowlist or open", c.E2BBuildNetwork)
	}
	if len(c.E2BBuildDomains) > 0 && egress.Mode(c.E2BBuildNetwork) != egress.ModeAllowlist {
		return errors.New("--e2b-build-allow-domain needs --e2b-build-network allowlist")
	}
	if c.E2BListen != "" && c.APIKey == "" {
		return errors.New("--e2b-listen needs an API key (--api-key or CORRAL_API_KEY)")
	}
	if c.Listen != "" && c.APIKey == "" {
		return errors.New("--listen needs an API key (--api-key or CORRAL_API_KEY): the TCP API must not be open")
	}
	if err := c.MCP.Check(); err != nil {
		return fmt.Errorf("MCP policy (--mcp-*): %w", err)
	}
	abs, err := filepath.Abs(c.StateDir)
	if err != nil {
		return err
	}
	c.StateDir = abs
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir(c.StateDir)
	}
	if c.RunDir, err = filepath.Abs(c.RunDir); err != nil {
		return err
	}
	return checkRunDir(c.RunDir)
}

// checkLimits refuses defaults above the maximum: every create that
// relied on them would fail.
func checkLimits(def, max sandbox.Limits) error {
	for _, f := range []struct {
		name     string
		def, max int64
	}{
		{"cpus (millicpus)", def.MilliCPUs, max.MilliCPUs},
		{"memory (bytes)", def.MemoryBytes, max.MemoryBytes},
		{"pids", def.Pids, max.Pids},
		{"disk (bytes)", def.DiskBytes, max.DiskBytes},
	} {
		if f.def < 0 || f.max < 0 {
			return fmt.Errorf("%s limits must not be negative", f.name)
		}
		if f.max > 0 && f.def > f.max {
			return fmt.Errorf("default %s %d exceeds the maximum %d", f.name, f.def, f.max)
		}
	}
	return nil
}
