package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
)

// Limits are resource limits; zero fields mean "no value".
type Limits struct {
	MilliCPUs   int64
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64
}

// DefaultExecOutput is the default cap on one exec's streamed output: big
// enough for any log a person reads, small enough that a runaway `yes`
// cannot fill a client's memory.
const DefaultExecOutput = 64 << 20

// Config wires a Manager. Store, Storage and at least one driver are
// required.
type Config struct {
	// Audit, when set, records every command started in a sandbox
	// (before it starts: a record that cannot be stored refuses it) and
	// how it ended.
	Audit   Auditor
	Store   Store
	Storage storage.Backend
	Drivers []driver.Driver
	// DefaultRuntime is used when a spec names none; default: the first
	// driver.
	DefaultRuntime string
	// Defaults fill zero resource fields of a spec; Max bounds them (a zero
	// field in Max means no bound).
	Defaults Limits
	Max      Limits
	// DefaultTimeout applies when a spec has none (default 5 minutes);
	// MaxTimeout bounds every timeout (0: no bound, and "no deadline" is
	// allowed).
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// ReapInterval is how often expired sandboxes are looked for
	// (default 1s).
	ReapInterval time.Duration
	// ExecOutput is the default cap on one exec's streamed output (stdout
	// and stderr together; DefaultExecOutput when 0, no cap when negative)
	// and MaxExecOutput the largest cap a request may ask for (0: none).
	ExecOutput    int64
	MaxExecOutput int64
	Logger        *slog.Logger
	// Now returns the current time; tests replace it.
	Now func() time.Time
	// Network, when set, gives every sandbox a network namespace prepared
	// on the host, where its egress policy is enforced (package network).
	// Without it sandboxes get the runtime's own namespace with loopback
	// only, and only network mode none is accepted.
	Network Network
	// NetworkDir holds each sandbox's resolv.conf and hosts files, at
	// <NetworkDir>/<id>/; required with Network.
	NetworkDir string
	// EgressCA is the PEM certificate of the CA with which the egress
	// proxy intercepts TLS for header and placeholder rules. With it,
	// every sandbox with a network trusts it: a bundle of its template's
	// trust store plus the CA, and the CA alone, are mounted read-only at
	// driver.CABundleDest and driver.CACertDest.
	EgressCA []byte
	// Secrets, when set, answers whether a tenant has the secrets that
	// egress rules name, so that a rule naming an unknown secret is
	// refused at create and update rather than failing each request.
	Secrets SecretLookup
	// DefaultNetwork is the network mode of a sandbox whose spec names
	// neither a mode nor rules (default none).
	DefaultNetwork egress.Mode
	// Mounter makes the host side of sandboxes' mounts of host
	// directories; without it a spec with mounts is refused.
	Mounter Mounter
	// Admission bounds the sandboxes the Manager accepts (package
	// admission).
	Admission admission.Config
	// Metrics is where the Manager registers its metric families (a
	// private registry when nil) and Events where it publishes lifecycle
	// events (a new bus when nil).
	Metrics *metrics.Registry
	Events  *events.Bus
	// PoolConcurrency bounds how many warm pool members are made at once
	// (default 2; poolfill.go).
	PoolConcurrency int
	// PoolRefillDelay is how long a pool waits after a claim before it
	// makes the claimed member's replacement (0: at once), so that the
	// claimer's first requests do not share the host's CPUs with the
	// replacement's creation.
	PoolRefillDelay time.Duration
	// SnapshotDir holds snapshots, one directory each; snapshots are
	// available when it is set, Store implements SnapshotStore and
	// Storage implements storage.Changes.
	SnapshotDir string
}

// Manager creates, tracks, times out and destroys sandboxes. It is safe for
// concurrent use. Start must be called before use and Close after.
type Manager struct {
	cfg     Config
	drivers map[string]driver.Driver
	log     *slog.Logger

	quota quotas

	mu        sync.RWMutex
	sandboxes map[string]*entry
	templates map[string]Template
	snaps     snapshots

	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// bg counts background network teardowns (releaseNetworkLater) and
	// agent warm-ups (warmAgent); bgClosed, under bgMu, turns new
	// teardowns synchronous, and drops new warm-ups, once Close waits.
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup

	adm   *admission.Controller
	bus   *events.Bus
	met   *Metrics
	usage usageCache
	pools pools     // warm pools (pool.go)
	vols  volumes   // named volumes (volumes.go)
	life  lifecycle // idle and deadline actions (lifecycle.go)

	// beforeLock, when set, is called by lock after the entry is looked
	// up and before it waits for op, so tests can order a delete there.
	beforeLock func(id string)
}

// entry is the Manager's live view of one sandbox. op serializes lifecycle
// operations (delete, timeout changes) on it; sb is guarded by Manager.mu.
type entry struct {
	op    sync.Mutex
	sb    Sandbox
	agent *agentclient.Client
	// netEnv is the proxy environment of the sandbox's network, the
	// lowest layer of every process's environment.
	netEnv []string
	// act tracks exec, file and PTY activity for the idle timeout.
	act activity
	// savedPaused says that the sandbox's memory was checkpointed while
	// it was paused, which gVisor allows once per pause (capture); under op.
	savedPaused bool
	// oomKills is the OOM-kill count of the sandbox's instance that
	// events.OOMKilled has reported (noteOOM), -1 when not known (an
	// instance found at Start); under m.mu.
	oomKills int64
}

// New validates cfg and returns a Manager; call Start to load state.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Storage == nil || len(cfg.Drivers) == 0 {
		return nil, errors.New("sandbox manager needs a store, a storage backend and a driver")
	}
	m := &Manager{
		cfg:       cfg,
		drivers:   make(map[string]driver.Driver),
		quota:     quotas{pending: map[string]usage{}, recent: map[string][]time.Time{}},
		log:       cfg.Logger,
		sandboxes: make(map[string]*entry),
		templates: make(map[string]Template),
		stop:      make(chan struct{}),
	}
	for _, d := range cfg.Drivers {
		m.drivers[d.Name()] = d
	}
	if m.cfg.DefaultRuntime == "" {
		m.cfg.DefaultRuntime = cfg.Drivers[0].Name()
	}
	if _, ok := m.drivers[m.cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("default runtime %q has no driver", m.cfg.DefaultRuntime)
	}
	if m.cfg.DefaultTimeout == 0 {
		m.cfg.DefaultTimeout = 5 * time.Minute
	}
	if m.cfg.ExecOutput == 0 {
		m.cfg.ExecOutput = DefaultExecOutput
	}
	// A default or maximum out of range would refuse every request.
	for _, l := range []Limits{m.cfg.Defaults, m.cfg.Max} {
		for _, f := range m.limitFields(&l) {
			if err := f.r.Check(*f.v); *f.v != 0 && err != nil {
				return nil, fmt.Errorf("server default or maximum: %w", err)
			}
		}
	}
	if err := errors.Join(RangeTimeout.CheckDuration(m.cfg.DefaultTimeout), RangeTimeout.CheckDuration(m.cfg.MaxTimeout)); err != nil {
		return nil, fmt.Errorf("server default or maximum timeout: %w", err)
	}
	if m.cfg.ReapInterval == 0 {
		m.cfg.ReapInterval = time.Second
	}
	if m.cfg.Now == nil {
		m.cfg.Now = time.Now
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.cfg.DefaultNetwork == "" {
		m.cfg.DefaultNetwork = egress.ModeNone
	}
	if _, err := (egress.Policy{Mode: m.cfg.DefaultNetwork}).Normalize(); err != nil {
		return nil, fmt.Errorf("default network: %w", err)
	}
	if cfg.Network != nil && cfg.NetworkDir == "" {
		return nil, errors.New("sandbox manager with a network needs a network directory")
	}
	if cfg.Network == nil && m.cfg.DefaultNetwork != egress.ModeNone {
		return nil, fmt.Errorf("default network mode %s needs network support", m.cfg.DefaultNetwork)
	}
	// The hooks run only once New returned, when m.met is set.
	var err error
	m.adm, err = admission.New(cfg.Admission, admission.Hooks{
		Refused: func(reason string) { m.met.AdmissionRefusals.Inc(reason) },
		Queued:  func(n int) { m.met.AdmissionQueue.Set(float64(n)) },
	})
	if err != nil {
		return nil, err
	}
	if m.bus = cfg.Events; m.bus == nil {
		m.bus = events.NewBus(0)
	}
	if m.cfg.Metrics == nil {
		m.cfg.Metrics = metrics.NewRegistry()
	}
	m.met = m.registerMetrics(m.cfg.Metrics)
	return m, nil
}

// Start loads the store, reconciles it with what the drivers and storage
// actually hold, and starts the deadline reaper. Sandboxes that were half
// made or half deleted when the daemon stopped are cleaned up; running ones
// are reattached; resources the store does not know are released.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.reconcileVolumes(ctx); err != nil {
		return err
	}
	if err := m.reconcile(ctx); err != nil {
		return err
	}
	for _, sb := range m.List(ctx, Filter{Pooled: true}) {
		if sb.State != StateStopped { // a stopped sandbox holds no claim
			m.adm.Hold(sb.ID, claimOf(sb))
		}
	}
	if err := m.reconcileSnapshots(ctx); err != nil {
		return err
	}
	if err := m.reconcileReady(ctx); err != nil {
		return err
	}
	if err := m.loadPools(ctx); err != nil {
		return err
	}
	m.wg.Add(2)
	go m.reapLoop()
	go m.poolLoop()
	return nil
}

// Close stops the reaper and waits for it and for network teardowns of
// deleted sandboxes. Sandboxes keep running. It is safe to call more than
// once.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() { close(m.stop) })
	m.wg.Wait()
	m.waitBackground()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.sandboxes {
		if e.agent != nil {
			e.agent.Close()
		}
	}
	return nil
}

// untilClose returns a context that ends when the manager closes, for work
// that outlives the request that started it.
func (m *Manager) untilClose() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Runtimes lists the available drivers and their capabilities.
func (m *Manager) Runtimes() []RuntimeInfo {
	out := make([]RuntimeInfo, 0, len(m.drivers))
	for name, d := range m.drivers {
		out = append(out, RuntimeInfo{Name: name, Default: name == m.cfg.DefaultRuntime, Capabilities: d.Capabilities(), Snapshot: m.SnapshotKind(name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Load is what a Manager's sandboxes hold of the host.
type Load struct {
	// Sandboxes exist or are being created, warm pool members included;
	// Running of them are running.
	Sandboxes, Running int
	// MilliCPUs and MemoryBytes are the limits they reserve.
	MilliCPUs, MemoryBytes int64
}

// Load reports the sandboxes and the resources they reserve, as
// admission counts them. It takes the Manager's read lock once.
func (m *Manager) Load() Load {
	count, mem, cpu, _ := m.adm.Usage()
	l := Load{Sandboxes: count, MilliCPUs: cpu, MemoryBytes: mem}
	m.mu.RLock()
	for _, e := range m.sandboxes {
		if e.sb.State == StateRunning {
			l.Running++
		}
	}
	m.mu.RUnlock()
	return l
}

// RuntimeInfo describes one driver.
type RuntimeInfo struct {
	Name         string              `json:"name"`
	Default      bool                `json:"default"`
	Capabilities driver.Capabilities `json:"capabilities"`
	// Snapshot is the kind of snapshot and fork the runtime gives
	// (SnapshotMemory or SnapshotFilesystem), empty when none.
	Snapshot string `json:"snapshot,omitempty"`
}

func (m *Manager) runtimeNames() []string {
	var names []string
	for n := range m.drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Get returns a copy of one sandbox.
func (m *Manager) Get(ctx context.Context, id string) (Sandbox, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" || !tenancy.Sees(ctx, e.sb.Tenant) {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e.sb.clone(), nil
}

// List returns copies of the sandboxes matching f, oldest first.
func (m *Manager) List(ctx context.Context, f Filter) []Sandbox {
	m.mu.RLock()
	out := make([]Sandbox, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		if f.match(e.sb) && tenancy.Sees(ctx, e.sb.Tenant) {
			out = append(out, e.sb.clone())
		}
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Stats reads a running sandbox's resource usage.
func (m *Manager) Stats(ctx context.Context, id string) (driver.Stats, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return driver.Stats{}, err
	}
	if sb.State == StateStopped {
		return driver.Stats{}, notRunning(id, sb.State)
	}
	return m.drivers[sb.Runtime].Stats(ctx, id)
}
