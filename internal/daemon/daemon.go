// Package daemon wires Corral's components from one Config and runs them:
// store, storage, drivers, sandbox Manager and the API listeners, started in
// dependency order and stopped in reverse. It holds no logic of its own
// beyond that order.
package daemon

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/e2b"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/images"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/reaper"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/btrfs"
	"github.com/corralrun/corral/internal/storage/overlay"
	"github.com/corralrun/corral/internal/store"
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
	// and delete, which on the state dir's disk file system cost
	// milliseconds per create (docs/BENCHMARKS.md). A state dir that still
	// holds such state of running sandboxes from an older Corral, which
	// kept it there, is used as the run dir until none is left.
	RunDir string
	// Socket is the root-only unix socket of the API
	// (default /run/corral/corral.sock).
	Socket string
	// Listen, when set, also serves the API on this TCP address; APIKey is
	// then required.
	Listen string
	APIKey string
	// E2BListen, when set, serves the E2B-compatible API on this TCP
	// address (point E2B_API_URL and E2B_SANDBOX_URL at it); APIKey is
	// then required. E2BDomain is the sandbox domain that API reports, for
	// a TLS proxy with a wildcard name in front of it (optional).
	E2BListen string
	E2BDomain string
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
	// there: "gvisor". Empty means gvisor when `corral doctor` finds it
	// usable on this host (see openGVisor).
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
	// (sandbox.Admission; zero: none, while `corral server` bounds the
	// starting slots by default).
	Admission sandbox.Admission
	// Pools are warm pools defined (or changed) at every start, next to
	// those defined through the API, which the store keeps.
	// PoolConcurrency bounds the pool sandboxes made at once (default 2);
	// PoolRefillDelay is how long a pool waits after a claim before it
	// replaces the member (sandbox.Config).
	Pools           []sandbox.Pool
	PoolConcurrency int
	PoolRefillDelay time.Duration
	Version         string
	Logger          *slog.Logger
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
	if c.E2BListen != "" && c.APIKey == "" {
		return errors.New("--e2b-listen needs an API key (--api-key or CORRAL_API_KEY)")
	}
	if c.Listen != "" && c.APIKey == "" {
		return errors.New("--listen needs an API key (--api-key or CORRAL_API_KEY): the TCP API must not be open")
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

// Daemon is a running Corral daemon.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	lock    *os.File
	runLock *os.File // the run dir's, when it is not the state dir
	store   *store.Store
	storage storage.Backend
	reaper  *reaper.Reaper
	drivers []driver.Driver
	egress  *egress.Server
	network *network.Manager
	manager *sandbox.Manager
	images  *images.Service
	servers []*http.Server
	e2b     *e2b.Server
	errc    chan error
}

// Start brings the daemon up: it locks the state dir, opens the store and
// storage, reconciles sandboxes left by an earlier daemon, and starts
// serving. On error everything started so far is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, errc: make(chan error, 2)}
	defer func() {
		if err != nil {
			d.shutdown(context.WithoutCancel(ctx))
		}
	}()
	if err := reaper.SetSubreaper(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	if d.lock, err = lockDir(cfg.StateDir); err != nil {
		return nil, err
	}
	dir, kept, err := runDir(d.cfg.StateDir, d.cfg.RunDir)
	if err != nil {
		return nil, err
	}
	if kept {
		d.log.Warn("the run dir of the last start still holds sandboxes: it stays the run dir until none is left",
			"run_dir", dir, "configured_run_dir", d.cfg.RunDir)
		d.cfg.RunDir = dir
	}
	if d.cfg.RunDir != d.cfg.StateDir {
		if err := makeRunDir(d.cfg.RunDir); err != nil {
			return nil, err
		}
		if d.runLock, err = lockDir(d.cfg.RunDir); err != nil {
			return nil, err
		}
	}
	if err := recordRunDir(d.cfg.StateDir, d.cfg.RunDir); err != nil {
		return nil, err
	}
	if d.store, err = store.Open(ctx, filepath.Join(cfg.StateDir, "corral.db")); err != nil {
		return nil, err
	}
	storageDir := filepath.Join(cfg.StateDir, "storage")
	// Each backend is assigned only once opened: a nil *btrfs.Backend in
	// d.storage would not be a nil interface, and Stop would close it.
	switch cfg.Storage {
	case "btrfs":
		var b *btrfs.Backend
		if b, err = btrfs.New(ctx, btrfs.Config{Dir: storageDir, ImageSize: cfg.BtrfsImageSize, QuotaMode: cfg.BtrfsQuotaMode, Logger: d.log}); err == nil {
			d.storage = b
		}
	case "overlay":
		var o *overlay.Backend
		if o, err = overlay.New(ctx, overlay.Config{Dir: filepath.Join(cfg.StateDir, "overlay"), Logger: d.log}); err == nil {
			d.storage = o
		}
	default:
		err = fmt.Errorf("unknown storage backend %q (use btrfs or overlay)", cfg.Storage)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s storage: %w", cfg.Storage, err)
	}
	d.reaper = reaper.New(reaper.Options{Logger: d.log})
	d.reaper.Start(context.WithoutCancel(ctx))
	if cfg.NoUserNamespaces {
		d.log.Warn("user namespaces are off for new templates: root in their sandboxes is root on the host, held back by capabilities, seccomp and namespaces")
	}
	rd, err := runc.New(runc.Config{
		Root:         filepath.Join(d.cfg.RunDir, "runc"),
		RuncPath:     cfg.RuncPath,
		AgentPath:    cfg.AgentPath,
		CgroupParent: cfg.CgroupParent,
		Reaper:       d.reaper,
		Logger:       d.log,
		OpenFiles:    cfg.OpenFiles,
		// A sandbox that makes a btrfs subvolume inside its root puts
		// the data written there outside the root's qgroup, and so
		// outside its disk limit. Denied whatever the storage: the
		// ioctls have no other use inside a sandbox.
		DenyIoctls:     btrfs.SubvolumeIoctls(),
		UserNamespaces: !cfg.NoUserNamespaces,
		UserNSSpares:   cfg.UserNSSpares,
	})
	if err != nil {
		return nil, fmt.Errorf("starting runc driver: %w", err)
	}
	d.drivers = append(d.drivers, rd)
	if err := d.openGVisor(ctx); err != nil {
		return nil, err
	}
	if err := d.openNetwork(); err != nil {
		return nil, err
	}
	reg := metrics.NewRegistry()
	d.manager, err = sandbox.New(sandbox.Config{
		Store:          d.store,
		Storage:        d.storage,
		Drivers:        d.drivers,
		DefaultRuntime: cfg.Runtime,
		Defaults:       cfg.Defaults,
		Max:            cfg.Max,
		DefaultTimeout: cfg.DefaultTimeout,
		MaxTimeout:     cfg.MaxTimeout,
		ExecOutput:     cfg.ExecOutput,
		MaxExecOutput:  cfg.MaxExecOutput,
		Network:        d.network,
		NetworkDir:     filepath.Join(d.cfg.RunDir, "netfiles"),
		DefaultNetwork: egress.Mode(cfg.DefaultNetwork),
		Admission:      cfg.Admission,
		Metrics:        reg,
		SnapshotDir:    filepath.Join(cfg.StateDir, "snapshots"),
		Logger:         d.log,

		PoolConcurrency: cfg.PoolConcurrency,
		PoolRefillDelay: cfg.PoolRefillDelay,
	})
	if err != nil {
		return nil, err
	}
	if err := d.manager.Start(ctx); err != nil {
		d.manager = nil
		return nil, fmt.Errorf("reconciling sandboxes: %w", err)
	}
	d.setPools(ctx, cfg.Pools)
	if err := d.openImages(); err != nil {
		return nil, err
	}
	srv := server.New(server.Config{Manager: d.manager, Images: d.images, Version: cfg.Version, Storage: d.storage.Name(), Metrics: reg, Logger: d.log})
	if err := d.serveUnix(srv.Handler()); err != nil {
		return nil, err
	}
	if cfg.Listen != "" {
		h, err := srv.AuthHandler(cfg.APIKey)
		if err != nil {
			return nil, err
		}
		if err := d.serveTCP(h); err != nil {
			return nil, err
		}
	}
	if cfg.E2BListen != "" {
		// The E2B facade authenticates itself: envd calls carry a
		// per-sandbox access token, not the API key.
		d.e2b = e2b.New(e2b.Config{Manager: d.manager, APIKey: cfg.APIKey, Domain: cfg.E2BDomain, Logger: d.log})
		l, err := net.Listen("tcp", cfg.E2BListen)
		if err != nil {
			return nil, fmt.Errorf("listening for the E2B API on %s: %w", cfg.E2BListen, err)
		}
		d.log.Info("serving the E2B-compatible API", "listen", l.Addr().String())
		d.serve(l, d.e2b.Handler())
	}
	d.log.Info("corral daemon started", "state_dir", cfg.StateDir, "run_dir", d.cfg.RunDir, "socket", cfg.Socket, "listen", cfg.Listen,
		"storage", d.storage.Name(), "agent", cfg.AgentPath, "sandboxes", len(d.manager.List(sandbox.Filter{})))
	return d, nil
}

// Manager returns the daemon's sandbox manager.
func (d *Daemon) Manager() *sandbox.Manager { return d.manager }

// Err delivers the first error of a listener that stopped unexpectedly.
func (d *Daemon) Err() <-chan error { return d.errc }

// Stop stops serving and releases daemon-wide resources. Sandboxes keep
// running and are reattached by the next daemon; if none remain, the
// storage is released too (for btrfs on a loop image: unmounted).
func (d *Daemon) Stop(ctx context.Context) {
	d.shutdown(ctx)
}

func (d *Daemon) shutdown(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if d.e2b != nil {
		_ = d.e2b.Close() // its streams must end before Shutdown waits for them
	}
	if d.images != nil {
		_ = d.images.Close() // cancels builds, whose streams then end
	}
	if d.manager != nil {
		d.manager.Events().Close() // event streams end, so Shutdown need not wait for them
	}
	for _, s := range d.servers {
		_ = s.Shutdown(ctx)
	}
	idle := true
	// Only a daemon that reconciled knows that no sandbox is left; one
	// that failed before must not remove what another daemon on the same
	// state or run dir may be using.
	started := d.manager != nil
	if started {
		idle = len(d.manager.List(sandbox.Filter{Pooled: true})) == 0
		_ = d.manager.Close() // waits for network teardowns
	}
	d.closeNetwork(ctx)
	for _, drv := range d.drivers {
		_ = drv.Close()
	}
	if d.reaper != nil {
		_ = d.reaper.Close()
	}
	if d.storage != nil && idle {
		if err := d.storage.Close(); err != nil {
			d.log.Error("closing storage", "err", err)
		}
	}
	if idle && started {
		removeCgroupParent(d.cfg.CgroupParent)
		if d.runLock != nil {
			removeRunDir(d.cfg.RunDir)
		}
	}
	if d.store != nil {
		_ = d.store.Close()
	}
	if d.runLock != nil {
		_ = d.runLock.Close()
	}
	if d.lock != nil {
		_ = d.lock.Close()
	}
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

// lockFile is the daemon's lock in its state dir and in its run dir.
const lockFile = "daemon.lock"

// lockDir takes an exclusive lock on dir/daemon.lock so that two daemons
// never manage the same state. The lock is released when the process dies.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening daemon lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another corral daemon uses %s: %w", dir, err)
	}
	return f, nil
}

func (d *Daemon) serveUnix(h http.Handler) error {
	if err := os.MkdirAll(filepath.Dir(d.cfg.Socket), 0o700); err != nil {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	// A socket file left by a killed daemon is stale: the state-dir lock
	// proves no other daemon serves it.
	if err := os.Remove(d.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", d.cfg.Socket)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", d.cfg.Socket, err)
	}
	if err := os.Chmod(d.cfg.Socket, 0o600); err != nil {
		l.Close()
		return err
	}
	d.serve(l, h)
	return nil
}

func (d *Daemon) serveTCP(h http.Handler) error {
	l, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", d.cfg.Listen, err)
	}
	d.serve(l, h)
	return nil
}

func (d *Daemon) serve(l net.Listener, h http.Handler) {
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	d.servers = append(d.servers, s)
	go func() {
		if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case d.errc <- fmt.Errorf("serving on %s: %w", l.Addr(), err):
			default:
			}
		}
	}()
}

// removeCgroupParent removes the daemon's cgroup parent from every
// hierarchy once no sandbox is left, so a stopped daemon leaves nothing in
// /sys/fs/cgroup. A parent that still has children (sandboxes of another
// daemon sharing it) stays: rmdir refuses non-empty cgroups.
func removeCgroupParent(parent string) {
	if parent == "" {
		parent = runc.DefaultCgroupParent
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", parent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent))
	for _, dir := range dirs {
		_ = os.Remove(dir)
	}
}

// AgentBinary is the file name of the agent-only binary (cmd/corral-agent).
const AgentBinary = "corral-agent"

// DefaultAgent returns the agent binary the daemon runs when its
// configuration names none: corral-agent next to this executable when it
// is there and usable (usableAgent), because it starts about 5 ms sooner
// than the full binary (cmd/corral-agent), and this executable itself
// (`corral agent`) otherwise. A corral-agent passed over is logged.
func DefaultAgent(log *slog.Logger) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding own executable for the agent: %w", err)
	}
	lean := filepath.Join(filepath.Dir(exe), AgentBinary)
	if _, err := os.Stat(lean); err != nil {
		return exe, nil
	}
	if err := usableAgent(lean); err != nil {
		log.Warn("not using "+AgentBinary+": running this executable as the agent instead", "path", lean, "reason", err)
		return exe, nil
	}
	return lean, nil
}

// usableAgent says why the agent-only binary at path cannot stand in for
// this executable's `corral agent`, nil when it can. It must be the
// corral-agent command, a static executable (it runs in sandbox roots that
// may have no dynamic loader) and, when both binaries record the commit
// they were built from, built from the same one: an agent left over from
// an older installation would speak an older protocol.
func usableAgent(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("it is linked dynamically (build it with CGO_ENABLED=0)")
		}
	}
	theirs, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading its build information: %w", err)
	}
	if theirs.Path != agentPackage {
		return fmt.Errorf("it is %s, not %s", theirs.Path, agentPackage)
	}
	ours, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	if a, b := commitOf(ours), commitOf(theirs); a != "" && b != "" && a != b {
		return fmt.Errorf("it was built from commit %s, this executable from %s", b, a)
	}
	return nil
}

// agentPackage is the main package of the agent-only binary.
const agentPackage = "github.com/corralrun/corral/cmd/corral-agent"

// commitOf returns the commit bi was built from, with "+modified" for a
// tree with uncommitted changes, or "" when the build did not record it
// (-buildvcs=false, or built outside a checkout).
func commitOf(bi *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev + modified
}
