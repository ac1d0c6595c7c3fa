// Package daemon wires Corral's components from one Config and runs them:
// store, storage, drivers, sandbox Manager and the API listeners, started in
// dependency order and stopped in reverse. It holds no logic of its own
// beyond that order.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/doctor"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/e2b"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/mcp"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/mounts"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/btrfs"
	"github.com/corralrun/corral/internal/storage/overlay"
	"github.com/corralrun/corral/internal/subreaper"
	"github.com/corralrun/corral/internal/templates"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/webhook"
	corral "github.com/corralrun/corral/sdk"
)

// Daemon is a running Corral daemon.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	lock    *os.File
	runLock *os.File // the run dir's, when it is not the state dir
	store   *records.Store
	storage storage.Backend
	reaper  *subreaper.Reaper
	drivers []driver.Driver
	idSlots *runc.IDSlots  // the runc driver's, lent to gVisor
	doctor  *doctor.Report // read once, by the first wantRuntime that needs it
	egress  *egress.Server
	network *network.Manager
	mounter *mounts.Mounter
	manager *sandbox.Manager
	// owners is the Manager from its creation on, for the egress proxy's
	// secret lookups, which may run while it reconciles.
	owners   atomic.Pointer[sandbox.Manager]
	metrics  *metrics.Registry
	images   *templates.Service
	servers  []*http.Server
	e2b      *e2b.Server
	mcp      *mcp.Server
	webhooks []*webhook.Sender
	keys     *tenancy.Keys // API keys, loaded by serveAPI
	secrets  *secrets.Store
	audit    *audit.Log
	cluster  *cluster.Cluster // with Config.ClusterEtcd
	member   *cluster.Member  // this node's registration in it
	errc     chan error
}

// Start brings the daemon up: it locks the state dir, opens the store and
// storage, reconciles sandboxes left by an earlier daemon, and starts
// serving. On error everything started so far is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, errc: make(chan error, 2)}
	// shutdown is the rollback as well as Stop: it releases, newest first,
	// what the steps below opened and skips what they did not reach.
	defer func() {
		if err != nil {
			d.shutdown(context.WithoutCancel(ctx))
		}
	}()
	// Each step needs the ones before it: the drivers the reaper and the
	// run dir, the Manager everything, the API the Manager and templates.
	for _, step := range []func(context.Context) error{
		d.lockStateDir,
		d.openRunDir,
		d.openStore,
		d.openStorage,
		d.startReaper,
		d.openRunc,
		d.openGVisor,
		d.openVM,
		d.openNetwork,
		d.openMounts,
		d.reconcile,
		d.openImages,
		d.dialCluster,
		d.serveAPI,
		d.serveE2B,
		d.joinCluster,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	d.log.Info("corral daemon started", "state_dir", d.cfg.StateDir, "run_dir", d.cfg.RunDir, "socket", d.cfg.Socket, "listen", d.cfg.Listen,
		"storage", d.storage.Name(), "agent", d.cfg.AgentPath, "sandboxes", len(d.manager.List(ctx, sandbox.Filter{})))
	return d, nil
}

// lockStateDir makes this process the subreaper of the sandboxes it
// starts, and takes the state dir's lock, so that no other daemon manages
// the same sandboxes.
func (d *Daemon) lockStateDir(context.Context) error {
	if err := subreaper.SetSubreaper(); err != nil {
		return err
	}
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	var err error
	d.lock, err = lockDir(d.cfg.StateDir)
	return err
}

// openRunDir settles which run dir this start uses (the one of the last
// start while it still holds sandboxes), makes and locks it, and records
// it in the state dir for the next start.
func (d *Daemon) openRunDir(context.Context) error {
	dir, kept, err := runDir(d.cfg.StateDir, d.cfg.RunDir)
	if err != nil {
		return err
	}
	if kept {
		d.log.Warn("the run dir of the last start still holds sandboxes: it stays the run dir until none is left",
			"run_dir", dir, "configured_run_dir", d.cfg.RunDir)
		d.cfg.RunDir = dir
	}
	if d.cfg.RunDir != d.cfg.StateDir {
		if err := makeRunDir(d.cfg.RunDir); err != nil {
			return err
		}
		if d.runLock, err = lockDir(d.cfg.RunDir); err != nil {
			return err
		}
	}
	return recordRunDir(d.cfg.StateDir, d.cfg.RunDir)
}

// openStore opens the SQLite records of sandboxes, templates and pools,
// the tenants' secrets in them under the state dir's key file, and the
// audit log beside them.
func (d *Daemon) openStore(ctx context.Context) error {
	var err error
	if d.store, err = records.Open(ctx, filepath.Join(d.cfg.StateDir, "corral.db")); err != nil {
		return err
	}
	if d.secrets, err = secrets.Open(d.store, filepath.Join(d.cfg.StateDir, "secrets.key")); err != nil {
		return err
	}
	d.audit, err = audit.Open(filepath.Join(d.cfg.StateDir, "audit"), audit.Options{})
	return err
}

// openStorage opens the storage backend Config.Storage names.
func (d *Daemon) openStorage(ctx context.Context) error {
	var err error
	// Each backend is assigned only once opened: a nil *btrfs.Backend in
	// d.storage would not be a nil interface, and Stop would close it.
	switch d.cfg.Storage {
	case "btrfs":
		var b *btrfs.Backend
		if b, err = btrfs.New(ctx, btrfs.Config{Dir: filepath.Join(d.cfg.StateDir, "storage"), ImageSize: d.cfg.BtrfsImageSize,
			QuotaMode: d.cfg.BtrfsQuotaMode, Logger: d.log}); err == nil {
			d.storage = b
		}
	case "overlay":
		var o *overlay.Backend
		if o, err = overlay.New(ctx, overlay.Config{Dir: filepath.Join(d.cfg.StateDir, "overlay"), Logger: d.log}); err == nil {
			d.storage = o
		}
	default:
		err = fmt.Errorf("unknown storage backend %q (use btrfs or overlay)", d.cfg.Storage)
	}
	if err != nil {
		return fmt.Errorf("opening %s storage: %w", d.cfg.Storage, err)
	}
	return nil
}

// startReaper starts reaping the orphans the drivers' processes leave to
// this subreaper.
func (d *Daemon) startReaper(ctx context.Context) error {
	d.reaper = subreaper.New(subreaper.Options{Logger: d.log})
	d.reaper.Start(context.WithoutCancel(ctx))
	return nil
}

// openRunc starts the runc driver, which is always there.
func (d *Daemon) openRunc(context.Context) error {
	cfg := d.cfg
	if cfg.NoUserNamespaces {
		d.log.Warn("user namespaces are off for new templates: root in their sandboxes is root on the host, held back by capabilities, seccomp and namespaces")
	}
	rd, err := runc.New(runc.Config{
		Root:         filepath.Join(cfg.RunDir, "runc"),
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
		return fmt.Errorf("starting runc driver: %w", err)
	}
	d.drivers = append(d.drivers, rd)
	d.idSlots = rd.IDSlots()
	return nil
}

// openMounts opens the host side of sandboxes' mounts. It is opened even
// when --allow-mount allows nothing, so that mounts an earlier daemon made
// are still released.
func (d *Daemon) openMounts(context.Context) error {
	m, err := mounts.New(mounts.Config{
		Allowed:  d.cfg.AllowMounts,
		RunDir:   filepath.Join(d.cfg.RunDir, "mounts"),
		StateDir: filepath.Join(d.cfg.StateDir, "mounts"),
		Logger:   d.log,
	})
	if err != nil {
		return fmt.Errorf("opening mounts: %w", err)
	}
	d.mounter = m
	return nil
}

// reconcile makes the sandbox Manager, which adopts or cleans up the
// sandboxes an earlier daemon left, and defines the configured pools.
func (d *Daemon) reconcile(ctx context.Context) error {
	cfg := d.cfg
	d.metrics = metrics.NewRegistry()
	m, err := sandbox.New(sandbox.Config{
		Audit:          d.audit,
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
		EgressCA:       d.egressCA(),
		Secrets:        d.secrets,
		Mounter:        d.mounter,
		NetworkDir:     filepath.Join(cfg.RunDir, "netfiles"),
		DefaultNetwork: egress.Mode(cfg.DefaultNetwork),
		Admission:      cfg.Admission,
		Metrics:        d.metrics,
		SnapshotDir:    filepath.Join(cfg.StateDir, "snapshots"),
		Logger:         d.log,

		PoolConcurrency: cfg.PoolConcurrency,
		PoolRefillDelay: cfg.PoolRefillDelay,
	})
	if err != nil {
		return err
	}
	d.owners.Store(m)
	// Webhooks start before reconciling, so that they send the events of
	// deadlines that passed while no daemon ran.
	if err := d.startWebhooks(m.Events()); err != nil {
		return err
	}
	// Only a Manager that reconciled is kept: shutdown takes a kept one
	// as proof of which sandboxes are left.
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("reconciling sandboxes: %w", err)
	}
	d.manager = m
	d.setPools(ctx, cfg.Pools)
	return nil
}

// serveAPI serves the REST API on the unix socket and, with
// Config.Listen, on TCP behind the API key, with the MCP endpoint at /mcp.
func (d *Daemon) serveAPI(context.Context) error {
	keys, err := tenancy.NewKeys(context.Background(), d.store, d.cfg.APIKey)
	if err != nil {
		return err
	}
	d.keys = keys
	scfg := server.Config{Manager: d.manager, Images: d.images, Version: d.cfg.Version, Storage: d.storage.Name(),
		Metrics: d.metrics, Keys: keys, Secrets: d.secrets, Audit: d.audit, Logger: d.log}
	if d.cluster != nil {
		scfg.Nodes = d.cluster
	}
	srv := server.New(scfg)
	if err := d.serveUnix(srv.Handler()); err != nil {
		return err
	}
	if d.cfg.Listen == "" {
		return nil
	}
	api, err := srv.AuthHandler(d.cfg.APIKey)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", d.cfg.Listen, err)
	}
	if d.cfg.NoMCP {
		d.serve(l, api)
		return nil
	}
	// MCP sessions call the API through this same listener, with the key
	// their client sent: the daemon's authentication and per-key limits
	// apply to them as to any client.
	// Never through a proxy: the requests carry the key in the clear.
	self := "http://" + loopback(l.Addr().(*net.TCPAddr))
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	d.mcp = mcp.New(mcp.Config{
		Client: func(h http.Header) (*corral.Client, error) {
			return corral.NewWithTransport(self, server.RequestKey(h),
				&http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 4})
		},
		Policy: d.cfg.MCP, Version: d.cfg.Version, Logger: d.log.With("component", "mcp"),
	})
	mh, err := srv.KeyHandler(d.cfg.APIKey, d.mcp.HTTPHandler(d.cfg.MCP.SessionIdle))
	if err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mh)
	mux.Handle("/", api)
	d.serve(l, mux)
	return nil
}

// loopback is the address at which this host reaches a listener on addr:
// 127.0.0.1 in place of an unspecified address (Go's listeners on "::"
// take IPv4 too, and IPv6 may be off).
func loopback(addr *net.TCPAddr) string {
	ip := addr.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(addr.Port))
}

// serveE2B serves the E2B-compatible API when Config.E2BListen asks for
// it. It authenticates itself: envd calls carry a per-sandbox access
// token, not the API key.
func (d *Daemon) serveE2B(context.Context) error {
	if d.cfg.E2BListen == "" {
		return nil
	}
	cfg := e2b.Config{Manager: d.manager, APIKey: d.cfg.APIKey, Keys: d.keys, Domain: d.cfg.E2BDomain, Audit: d.audit, Logger: d.log}
	if d.images != nil {
		cfg.Templates, cfg.BuildDir = d.images, filepath.Join(d.cfg.StateDir, "e2b-templates")
		cfg.BuildNetwork = egress.Policy{Mode: egress.Mode(d.cfg.E2BBuildNetwork)}
		for _, name := range d.cfg.E2BBuildDomains {
			cfg.BuildNetwork.Domains = append(cfg.BuildNetwork.Domains, egress.DomainRule{Name: name})
		}
	}
	srv, err := e2b.New(cfg)
	if err != nil {
		return err
	}
	d.e2b = srv
	l, err := net.Listen("tcp", d.cfg.E2BListen)
	if err != nil {
		return fmt.Errorf("listening for the E2B API on %s: %w", d.cfg.E2BListen, err)
	}
	d.log.Info("serving the E2B-compatible API", "listen", l.Addr().String())
	d.serve(l, d.e2b.Handler())
	return nil
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
	d.leaveCluster(ctx) // first: no node should count on this one once it stops serving
	if d.mcp != nil {
		d.mcp.Close() // deletes the sessions' sandboxes through the API, so before it stops
	}
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
	// After the last request's events, and while the Manager is there.
	d.closeWebhooks(ctx)
	if d.cluster != nil {
		_ = d.cluster.Close() // after the last request that lists nodes
	}
	idle := true
	// Only a daemon that reconciled knows that no sandbox is left; one
	// that failed before must not remove what another daemon on the same
	// state or run dir may be using.
	started := d.manager != nil
	if started {
		idle = len(d.manager.List(ctx, sandbox.Filter{Pooled: true})) == 0
		_ = d.manager.Close() // waits for network teardowns
	}
	d.closeNetwork(ctx)
	if d.mounter != nil {
		_ = d.mounter.Close()
	}
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
	if d.audit != nil {
		_ = d.audit.Close()
	}
	if d.runLock != nil {
		_ = d.runLock.Close()
	}
	if d.lock != nil {
		_ = d.lock.Close()
	}
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
