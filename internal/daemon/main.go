package daemon

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/sandbox"
)

// Main runs `corral server` with args and returns the exit code: it parses
// flags into a Config, starts the daemon, and stops it on SIGINT or SIGTERM.
func Main(args []string, version string) int {
	cfg, ok := parseFlags(args)
	if !ok {
		return 2
	}
	cfg.Version = version
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := Start(ctx, cfg)
	if err != nil {
		cfg.Logger.Error("starting daemon", "err", err)
		return 1
	}
	code := 0
	select {
	case <-ctx.Done():
	case err := <-d.Err():
		cfg.Logger.Error("daemon stopped", "err", err)
		code = 1
	}
	d.Stop(context.Background())
	cfg.Logger.Info("corral daemon stopped")
	return code
}

// parseFlags turns the flags of `corral server` into a Config with its
// Logger; on a usage error it has said what is wrong and returns false.
func parseFlags(args []string) (Config, bool) {
	fs := flag.NewFlagSet("corral server", flag.ContinueOnError)
	var cfg Config
	daemonFlags(fs, &cfg)
	sandboxFlags(fs, &cfg)
	networkFlags(fs, &cfg)
	admissionFlags(fs, &cfg)
	mcpFlags(fs, &cfg)
	webhookFlags(fs, &cfg)
	clusterFlags(fs, &cfg)
	userns := fs.Bool("userns", true, "build new templates for sandboxes in user namespaces, where root is not host root")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "corral server: unexpected arguments %v\n", fs.Args())
		return cfg, false
	}
	cfg.NoUserNamespaces = !*userns
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "corral server: invalid --log-level %q\n", *logLevel)
		return cfg, false
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return cfg, true
}

// daemonFlags are the flags of where the daemon keeps its state, what it
// serves on, and which storage and runtimes it uses.
func daemonFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/corral", "state directory (database, storage, templates, snapshots)")
	fs.StringVar(&cfg.RunDir, "run-dir", "", "directory of running sandboxes' runtime state, best on a tmpfs (default "+DefaultRunRoot+"/state-<hash of the state dir>)")
	fs.StringVar(&cfg.Socket, "socket", "/run/corral/corral.sock", "root-only unix socket of the API")
	fs.StringVar(&cfg.Listen, "listen", "", "also serve the API on HOST:PORT (needs an API key)")
	fs.StringVar(&cfg.E2BListen, "e2b-listen", "", "also serve the E2B-compatible API on HOST:PORT (needs an API key)")
	fs.StringVar(&cfg.E2BDomain, "e2b-domain", "", "sandbox domain the E2B API reports (optional)")
	fs.StringVar(&cfg.E2BBuildNetwork, "e2b-build-network", "none", "network of RUN steps in templates built through the E2B API (aptInstall, pipInstall, ...): none, allowlist or open")
	fs.Var(pathsFlag{&cfg.E2BBuildDomains}, "e2b-build-allow-domain", "domain those RUN steps may reach with --e2b-build-network allowlist (repeatable)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CORRAL_API_KEY"), "API key required on --listen (default $CORRAL_API_KEY)")
	fs.StringVar(&cfg.Storage, "storage", "btrfs", "storage backend: btrfs or overlay")
	fs.StringVar(&cfg.BtrfsQuotaMode, "btrfs-quota-mode", "simple", "how btrfs storage accounts disk limits: simple (each extent charged to the sandbox that wrote it; falls back to full on kernels before 6.7) or full (classic qgroups)")
	fs.StringVar(&cfg.Runtime, "runtime", "runc", "default runtime")
	fs.StringVar(&cfg.RuncPath, "runc", "", "runc binary (default: from PATH)")
	fs.Var(runtimesFlag{&cfg.Runtimes}, "runtimes", "runtimes besides runc, comma-separated: gvisor, vm (default: each that corral doctor finds usable)")
	fs.StringVar(&cfg.RunscPath, "runsc", "", "runsc binary (default: from PATH)")
	fs.StringVar(&cfg.AgentPath, "agent", "", "static in-sandbox agent binary (default: "+AgentBinary+" next to this executable if there, else this executable)")
	fs.StringVar(&cfg.GVisorPlatform, "gvisor-platform", "", "gVisor platform (default systrap)")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "/corral", "cgroup that holds one cgroup per sandbox")
}

// sandboxFlags are the flags of sandboxes' defaults and bounds.
func sandboxFlags(fs *flag.FlagSet, cfg *Config) {
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", 5*time.Minute, "sandbox lifetime when a create names none")
	fs.Int64Var(&cfg.ExecOutput, "exec-output", 0, "default cap on one exec's output in bytes, after which it is truncated with a marker (0: 64 MiB, -1: none)")
	fs.Int64Var(&cfg.MaxExecOutput, "max-exec-output", 0, "largest output cap an exec may ask for, in bytes (0: no maximum)")
	fs.DurationVar(&cfg.MaxTimeout, "max-timeout", 0, "longest allowed sandbox lifetime (0: no limit, and sandboxes without deadline are allowed)")
	cfg.Defaults = DefaultLimits()
	fs.Var(cpuFlag{&cfg.Defaults.MilliCPUs}, "default-cpus", "CPU limit in cores of a sandbox that names none (0: unlimited)")
	fs.Var(sizeFlag{&cfg.Defaults.MemoryBytes}, "default-memory", "memory limit of a sandbox that names none, e.g. 512M (0: unlimited)")
	fs.Int64Var(&cfg.Defaults.Pids, "default-pids", cfg.Defaults.Pids, "process and thread limit of a sandbox that names none (0: unlimited)")
	fs.Var(sizeFlag{&cfg.Defaults.DiskBytes}, "default-disk", "disk limit of a sandbox that names none, e.g. 10G (0: unlimited; btrfs storage only)")
	fs.Var(cpuFlag{&cfg.Max.MilliCPUs}, "max-cpus", "largest CPU limit a sandbox may ask for (0: no maximum)")
	fs.Var(sizeFlag{&cfg.Max.MemoryBytes}, "max-memory", "largest memory limit a sandbox may ask for (0: no maximum)")
	fs.Int64Var(&cfg.Max.Pids, "max-pids", 0, "largest process limit a sandbox may ask for (0: no maximum)")
	fs.Var(sizeFlag{&cfg.Max.DiskBytes}, "max-disk", "largest disk limit a sandbox may ask for (0: no maximum)")
	fs.Uint64Var(&cfg.OpenFiles, "open-files", runc.DefaultOpenFiles, "open files limit (RLIMIT_NOFILE) of every sandbox process")
	fs.Var(pathsFlag{&cfg.AllowMounts}, "allow-mount", "host directory beneath which sandboxes may mount directories (-v SRC:DST), an absolute path (repeatable; default: none, no mounts)")
}

// networkFlags are the flags of sandboxes' networks and of the spares
// made ahead for creates.
func networkFlags(fs *flag.FlagSet, cfg *Config) {
	cfg.NetworkSubnet = netip.MustParsePrefix(DefaultNetworkSubnet)
	fs.StringVar(&cfg.DefaultNetwork, "default-network", "none", "network mode of sandboxes that name none: none, allowlist or open")
	fs.Var(prefixFlag{&cfg.NetworkSubnet}, "network-subnet", "private IPv4 range for sandbox addresses, a /30 each")
	fs.Var(upstreamsFlag{&cfg.DNSUpstreams}, "dns-upstream", "DNS server for sandboxes' allowed lookups, ADDRESS[:PORT] (repeatable; default: the nameservers of /etc/resolv.conf)")
	fs.StringVar(&cfg.NetworkPrefix, "network-prefix", DefaultNetworkPrefix, "name prefix of sandboxes' host-side interfaces (unique per daemon on a host)")
	fs.IntVar(&cfg.UserNSSpares, "userns-spares", 2, "user namespaces of runc sandboxes made ahead, so that creates skip making one (0: none)")
	fs.IntVar(&cfg.NetworkSpares, "network-spares", 2, "sandbox networks of each kind (mode none, and with an interface) made ahead, so that creates skip making a namespace and veth (0: none)")
	fs.StringVar(&cfg.NetworkTable, "nft-table", DefaultNetworkTable, "nftables table (inet) of sandbox rules (unique per daemon on a host)")
}

// admissionFlags are the flags of how many sandboxes the daemon accepts
// and of its warm pools.
func admissionFlags(fs *flag.FlagSet, cfg *Config) {
	fs.IntVar(&cfg.Admission.MaxSandboxes, "max-sandboxes", 0, "most sandboxes that may exist or be in creation at once; more creates answer 503 busy (0: no limit)")
	fs.Float64Var(&cfg.Admission.MemoryCommitRatio, "memory-commit-ratio", 0, "refuse creates (503 busy) once sandboxes' memory limits add up to the host's memory times this ratio (0: no limit)")
	fs.Float64Var(&cfg.Admission.CPUCommitRatio, "cpu-commit-ratio", 0, "refuse creates (503 busy) once sandboxes' CPU limits add up to the host's CPUs times this ratio (0: no limit)")
	fs.IntVar(&cfg.Admission.MaxPerPrincipal, "max-per-key", 0, "most sandboxes one API key (or the unix socket) may have or be creating at once; more answer 429 (0: no limit)")
	fs.IntVar(&cfg.Admission.QueueLength, "admission-queue", 0, "creates that may wait for capacity instead of failing at once (needs --admission-wait)")
	fs.DurationVar(&cfg.Admission.MaxWait, "admission-wait", 0, "longest a create waits in the admission queue before 503 busy")
	fs.IntVar(&cfg.Admission.MaxStarting, "max-starting", runtime.NumCPU()*admission.StartingPerCPU, "creates started at once (storage, runtime, agent ready); more wait in the start queue (0: no limit; default: 2 per CPU)")
	fs.IntVar(&cfg.Admission.StartQueueLength, "start-queue", runtime.NumCPU()*admission.StartQueuePerCPU, "creates that may wait for a starting slot; more answer 503 busy (0: none wait; default: 32 per CPU)")
	fs.DurationVar(&cfg.Admission.StartWait, "start-wait", admission.DefaultStartWait, "longest a create waits for a starting slot before 503 busy")
	fs.IntVar(&cfg.PoolConcurrency, "pool-concurrency", 2, "warm pool sandboxes created at once, over all pools")
	fs.DurationVar(&cfg.PoolRefillDelay, "pool-refill-delay", 250*time.Millisecond, "how long a pool waits after a claim before it replaces the member, so that the claimer's first requests get the CPUs (0: at once)")
	fs.Var(poolsFlag{&cfg.Pools}, "pool", "warm pool name=NAME,template=T[,runtime=R][,size=N][,cpus=C][,memory=M][,pids=N][,disk=D][,network=MODE] (repeatable)")
}

// mcpFlags are the flags of the MCP endpoint.
func mcpFlags(fs *flag.FlagSet, cfg *Config) {
	fs.BoolVar(&cfg.NoMCP, "no-mcp", false, "do not serve the Model Context Protocol at /mcp on --listen")
	cfg.MCP.Flags(fs, "mcp-")
}

// webhookFlags are the flags of the lifecycle webhooks.
func webhookFlags(fs *flag.FlagSet, cfg *Config) {
	fs.Var(pathsFlag{&cfg.Webhooks}, "webhook", "POST every sandbox lifecycle event as JSON to this http or https URL (repeatable)")
	fs.StringVar(&cfg.WebhookSecret, "webhook-secret", os.Getenv("CORRAL_WEBHOOK_SECRET"), "key of the HMAC-SHA256 signature of webhook requests (default $CORRAL_WEBHOOK_SECRET)")
}

// DefaultLimits returns the resource limits of a sandbox that names none,
// unless flags or Config.Defaults say otherwise.
func DefaultLimits() sandbox.Limits {
	return sandbox.Limits{MilliCPUs: 1000, MemoryBytes: 512 << 20, Pids: 1024}
}

// cpuFlag is a CPU limit in cores ("1.5") stored as millicpus.
type cpuFlag struct{ v *int64 }

func (f cpuFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatFloat(float64(*f.v)/1000, 'f', -1, 64)
}

func (f cpuFlag) Set(s string) error {
	c, err := strconv.ParseFloat(s, 64)
	if err != nil || c < 0 || c > 1<<20 {
		return fmt.Errorf("want a number of cores like 0.5 or 2")
	}
	*f.v = int64(math.Round(c * 1000))
	return nil
}

// sizeFlag is a size in bytes written with an optional binary suffix: 512M,
// 2G, 1.5T; a plain number is bytes.
type sizeFlag struct{ v *int64 }

func (f sizeFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return "0"
	}
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if *f.v%u.size == 0 {
			return strconv.FormatInt(*f.v/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(*f.v, 10)
}

func (f sizeFlag) Set(s string) error {
	num := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := 1.0
	if n := len(num); n > 0 {
		if i := strings.IndexByte("KMGT", num[n-1]); i >= 0 {
			mult = float64(int64(1) << (10 * (i + 1)))
			num = num[:n-1]
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v*mult > 1<<62 {
		return fmt.Errorf("want a size like 512M or 10G")
	}
	*f.v = int64(v * mult)
	return nil
}
