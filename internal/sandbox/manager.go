package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/agent"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/wire"
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
	// DefaultNetwork is the network mode of a sandbox whose spec names
	// neither a mode nor rules (default none).
	DefaultNetwork egress.Mode
	// Admission bounds the sandboxes the Manager accepts (admission.go).
	Admission Admission
	// Metrics is where the Manager registers its metric families (a
	// private registry when nil) and Events where it publishes lifecycle
	// events (a new bus when nil).
	Metrics *metrics.Registry
	Events  *events.Bus
	// PoolConcurrency bounds how many warm pool members are made at once
	// (default 2; pool.go).
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

	adm   *admitter
	bus   *events.Bus
	met   *Metrics
	usage usageCache
	pools pools     // warm pools (pool.go)
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
	agent *agent.Client
	// netEnv is the proxy environment of the sandbox's network, the
	// lowest layer of every process's environment.
	netEnv []string
	// act tracks exec, file and PTY activity for the idle timeout.
	act activity
	// savedPaused says that the sandbox's memory was checkpointed while
	// it was paused, which gVisor allows once per pause (capture); under op.
	savedPaused bool
}

// New validates cfg and returns a Manager; call Start to load state.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Storage == nil || len(cfg.Drivers) == 0 {
		return nil, errors.New("sandbox manager needs a store, a storage backend and a driver")
	}
	m := &Manager{
		cfg:       cfg,
		drivers:   make(map[string]driver.Driver),
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
	var err error
	if m.adm, err = newAdmitter(cfg.Admission); err != nil {
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
	if err := m.reconcile(ctx); err != nil {
		return err
	}
	for _, sb := range m.List(Filter{Pooled: true}) {
		m.adm.hold(sb.ID, claimOf(sb))
	}
	if err := m.reconcileSnapshots(ctx); err != nil {
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

// Runtimes lists the available drivers and their capabilities.
func (m *Manager) Runtimes() []RuntimeInfo {
	out := make([]RuntimeInfo, 0, len(m.drivers))
	for name, d := range m.drivers {
		out = append(out, RuntimeInfo{Name: name, Default: name == m.cfg.DefaultRuntime, Capabilities: d.Capabilities(), Snapshot: m.SnapshotKind(name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
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

// Create makes a sandbox and returns it running. It records the sandbox
// before the instance starts (while its storage and network are made), and
// on failure (including ctx being canceled) releases everything it
// acquired and forgets the sandbox.
//
// A spec that matches a warm pool (pool.go) gets a sandbox from it when one
// is ready, and a cold create otherwise. With spec.FromSnapshot it starts
// from a snapshot (createFromSnapshot).
func (m *Manager) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	return m.createWith(ctx, spec, nil)
}

// createWith is Create, which hands started to a cold create (see create).
func (m *Manager) createWith(ctx context.Context, spec Spec, started startedFunc) (Sandbox, error) {
	if spec.FromSnapshot != "" {
		return m.createFromSnapshot(ctx, spec)
	}
	spec, sb, claimed, err := m.claim(ctx, spec)
	if err != nil || claimed {
		return sb, err
	}
	return m.createSpec(ctx, spec, nil, started)
}

// createSpec admits spec for ctx's caller and creates it (see create).
func (m *Manager) createSpec(ctx context.Context, spec Spec, src *restoreSource, started startedFunc) (Sandbox, error) {
	sb, drv, err := m.admit(spec)
	if err != nil {
		return Sandbox{}, err
	}
	sb.Owner = principalOf(ctx)
	return m.create(ctx, sb, drv, src, started)
}

// startedFunc is told, at most once and from the driver's Create, that the
// sandbox of entry e is reachable through its agent client c, which the
// sandbox keeps once running (driver.Spec.Started). It must not block.
type startedFunc func(e *entry, c *agent.Client)

// create makes the admitted sandbox sb on drv (see Create): a user's, a
// fork's copy or a warm pool member; starting from src's files (and
// memory) when src is set. started, when set, learns when the agent can
// take requests (startedFunc), and the create then leaves the agent's
// first round trip to those requests instead of warming its connection
// itself.
//
// Every create with a sandbox ID passes here, so this is where one that
// fails is logged, with its cause; the callers return the error without
// logging it again.
func (m *Manager) create(ctx context.Context, sb Sandbox, drv driver.Driver, src *restoreSource, started startedFunc) (Sandbox, error) {
	begin := time.Now()
	// Admission before anything is acquired; forget gives the claim back.
	done, err := m.adm.reserve(ctx, sb.ID, claimOf(sb))
	if err != nil {
		m.logFailedCreate(ctx, sb, time.Since(begin), err)
		return Sandbox{}, err
	}
	defer done()
	out, err := m.build(ctx, sb, drv, src, started, time.Since(begin))
	if err != nil {
		m.logFailedCreate(ctx, sb, time.Since(begin), err)
	}
	return out, err
}

// logFailedCreate logs the create of sb that failed with err after d: a
// refusal (the server busy, the caller over its limit, anything else that
// says when to retry) or a caller that gave up as a warning, anything else as an error. A sandbox without an
// ID is a create refused before it got one.
func (m *Manager) logFailedCreate(ctx context.Context, sb Sandbox, d time.Duration, err error) {
	level, msg := slog.LevelError, "sandbox create failed"
	switch {
	case errors.Is(err, errdefs.ErrBusy), errors.Is(err, errdefs.ErrResourceExhausted), errdefs.RetryAfter(err) > 0:
		level, msg = slog.LevelWarn, "sandbox create refused"
	case ctx.Err() != nil:
		level = slog.LevelWarn
	}
	var attrs []any
	if sb.ID != "" {
		attrs = append(attrs, "sandbox_id", sb.ID)
	}
	attrs = append(attrs, "runtime", sb.Runtime, "template", sb.Template, "duration_ms", d.Milliseconds(), "err", err)
	if sb.Pool != "" {
		attrs = append(attrs, "pool", sb.Pool)
	}
	m.log.Log(context.WithoutCancel(ctx), level, msg, attrs...)
}

// build is create once sb is admitted and holds a starting slot; waited
// is how long admission took.
func (m *Manager) build(ctx context.Context, sb Sandbox, drv driver.Driver, src *restoreSource, started startedFunc, waited time.Duration) (Sandbox, error) {
	e := &entry{sb: sb}
	e.op.Lock()
	defer e.op.Unlock()

	m.mu.Lock()
	m.sandboxes[sb.ID] = e
	m.mu.Unlock()

	var undo []func(context.Context)
	recorded := false
	fail := func(err error) (Sandbox, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i](cctx)
		}
		m.forget(cctx, sb.ID)
		if recorded {
			m.emit(events.Deleted, sb, err)
		}
		return Sandbox{}, err
	}

	// The record, storage and network do not depend on each other: they
	// are made at once, each up to a few milliseconds of the create. The
	// instance starts only once the record is in; a crash before that
	// leaves a root and a network without one, which reconcile removes as
	// orphans, as it removes whatever a crash leaves of a recorded create.
	start := time.Now()
	recordc := make(chan error, 1)
	go func() { recordc <- m.cfg.Store.PutSandbox(ctx, sb) }()
	type netResult struct {
		spec *driver.Network
		err  error
		done time.Time
	}
	netc := make(chan netResult, 1)
	go func() {
		spec, err := m.setupNetwork(ctx, sb)
		netc <- netResult{spec, err, time.Now()}
	}()
	root, err := m.cfg.Storage.CreateRoot(ctx, sb.ID, sb.Template, storage.RootOptions{DiskBytes: sb.DiskBytes})
	if err != nil {
		err = fmt.Errorf("creating root of sandbox %s: %w", sb.ID, err)
	} else {
		undo = append(undo, func(ctx context.Context) {
			if err := m.cfg.Storage.DeleteRoot(ctx, sb.ID); err != nil {
				m.log.Error("rolling back root", "sandbox_id", sb.ID, "err", err)
			}
		})
		if src != nil {
			if err = src.applyFiles(ctx, root); err != nil {
				err = fmt.Errorf("restoring files of sandbox %s: %w", sb.ID, err)
			}
		}
	}
	storageDone := time.Now()
	if rerr := <-recordc; rerr != nil {
		err = errors.Join(fmt.Errorf("recording sandbox %s: %w", sb.ID, rerr), err)
	} else {
		recorded = true
		m.emit(events.Created, sb, nil)
	}
	net := <-netc
	if net.err == nil {
		undo = append(undo, func(ctx context.Context) {
			if err := m.releaseNetwork(ctx, sb.ID); err != nil {
				m.log.Error("rolling back network", "sandbox_id", sb.ID, "err", err)
			}
		})
	}
	// Both may fail: the storage error first, the network's (which
	// names the sandbox already) joined to it.
	if err = errors.Join(err, net.err); err != nil {
		return fail(err)
	}
	netSpec := net.spec
	if netSpec != nil {
		m.mu.Lock()
		e.netEnv = netSpec.Env
		m.mu.Unlock()
	}
	setupDone := time.Now()
	ag := m.newAgent(drv, sb.ID)
	dspec := driver.Spec{
		ID:       sb.ID,
		RootFS:   root,
		Hostname: sb.ID,
		Resources: driver.Resources{
			MilliCPUs:   sb.MilliCPUs,
			MemoryBytes: sb.MemoryBytes,
			Pids:        sb.Pids,
		},
		Network: netSpec,
	}
	var once sync.Once
	if started != nil {
		dspec.Started = func() { once.Do(func() { started(e, ag) }) }
	}
	err = m.startInstance(ctx, drv, dspec, src)
	once.Do(func() {}) // a late call starts nothing
	if err != nil {
		return fail(fmt.Errorf("starting sandbox %s: %w", sb.ID, err))
	}
	undo = append(undo, func(ctx context.Context) {
		if err := drv.Delete(ctx, sb.ID); err != nil {
			m.log.Error("rolling back instance", "sandbox_id", sb.ID, "err", err)
		}
	})
	driverDone := time.Now()
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("creating sandbox %s: %w", sb.ID, err))
	}

	if started == nil {
		m.warmAgent(ag)
	}
	running, err := m.transition(ctx, e, move{to: StateRunning, event: events.Running, edit: func(e *entry) { e.agent = ag }})
	if err != nil {
		return fail(err)
	}
	sb = running
	m.met.CreateSeconds.Observe(time.Since(start).Seconds(), sb.Runtime)
	m.log.Info("sandbox created", "sandbox_id", sb.ID, "runtime", sb.Runtime, "template", sb.Template,
		"duration_ms", time.Since(start).Milliseconds(), "wait_ms", waited.Milliseconds(), "storage_ms", storageDone.Sub(start).Milliseconds(),
		"network_ms", net.done.Sub(start).Milliseconds(), "driver_ms", driverDone.Sub(setupDone).Milliseconds())
	return sb, nil
}

// admit validates spec, applies defaults and bounds, and returns the new
// sandbox record (state creating) and its driver.
func (m *Manager) admit(spec Spec) (Sandbox, driver.Driver, error) {
	rt := spec.Runtime
	if rt == "" {
		rt = m.cfg.DefaultRuntime
	}
	drv, ok := m.drivers[rt]
	if !ok {
		return Sandbox{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown runtime %q (available: %s)", rt, strings.Join(m.runtimeNames(), ", "))
	}
	if spec.Template == "" {
		return Sandbox{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "template is required")
	}
	m.mu.RLock()
	_, ok = m.templates[spec.Template]
	m.mu.RUnlock()
	if !ok {
		return Sandbox{}, nil, errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", spec.Template)
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Sandbox{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid environment variable name %q", k)
		}
	}
	lim := Limits{MilliCPUs: spec.MilliCPUs, MemoryBytes: spec.MemoryBytes, Pids: spec.Pids, DiskBytes: spec.DiskBytes}
	lim, err := m.bound(lim)
	if err != nil {
		return Sandbox{}, nil, err
	}
	now := m.cfg.Now()
	timeout := m.cfg.DefaultTimeout
	if spec.Timeout != nil {
		timeout = *spec.Timeout
	}
	deadline, err := m.deadline(now, timeout)
	if err != nil {
		return Sandbox{}, nil, err
	}
	mode := m.cfg.DefaultNetwork
	if hasRules(spec.Network) {
		mode = egress.ModeAllowlist // rules ask for a restriction, whatever the default
	}
	policy, err := m.resolvePolicy(spec.Network, mode)
	if err != nil {
		return Sandbox{}, nil, err
	}
	life, err := m.admitLifecycle(drv, Lifecycle{IdleTimeout: &spec.IdleTimeout, OnDeadline: spec.OnDeadline, OnIdle: spec.OnIdle})
	if err != nil {
		return Sandbox{}, nil, err
	}
	return Sandbox{
		ID:          newID(),
		Template:    spec.Template,
		Runtime:     rt,
		State:       StateCreating,
		MilliCPUs:   lim.MilliCPUs,
		MemoryBytes: lim.MemoryBytes,
		Pids:        lim.Pids,
		DiskBytes:   lim.DiskBytes,
		Env:         cloneMap(spec.Env),
		Metadata:    cloneMap(spec.Metadata),
		CreatedAt:   now.UTC(),
		Deadline:    deadline,
		Network:     policy,
		IdleTimeout: *life.IdleTimeout,
		OnDeadline:  life.OnDeadline,
		OnIdle:      life.OnIdle,
	}, drv, nil
}

// bound fills the zero fields of l with the defaults and checks every
// field against its range and the server maximum.
func (m *Manager) bound(l Limits) (Limits, error) {
	for _, f := range m.limitFields(&l) {
		if *f.v == 0 {
			*f.v = f.def
		}
		if err := f.check(*f.v); err != nil {
			return l, err
		}
	}
	return l, nil
}

// limitField is one field of a Limits: where it is, its range, its
// default and its server maximum (0: none).
type limitField struct {
	v          *int64
	r          Range
	def, limit int64
}

// check accepts 0 (no limit) and values in range up to the maximum.
func (f limitField) check(v int64) error {
	if v == 0 {
		return nil
	}
	if err := f.r.Check(v); err != nil {
		return err
	}
	if f.limit > 0 && v > f.limit {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %s exceeds the server maximum %s", f.r.Field,
			fmtBound(float64(v)/float64(f.r.Scale)), fmtBound(float64(f.limit)/float64(f.r.Scale)))
	}
	return nil
}

// limitFields lists the fields of l with their ranges and bounds.
func (m *Manager) limitFields(l *Limits) []limitField {
	d, x := m.cfg.Defaults, m.cfg.Max
	return []limitField{
		{&l.MilliCPUs, RangeCPUs, d.MilliCPUs, x.MilliCPUs},
		{&l.MemoryBytes, RangeMemory, d.MemoryBytes, x.MemoryBytes},
		{&l.Pids, RangePids, d.Pids, x.Pids},
		{&l.DiskBytes, RangeDisk, d.DiskBytes, x.DiskBytes},
	}
}

func (m *Manager) deadline(now time.Time, timeout time.Duration) (time.Time, error) {
	if err := RangeTimeout.CheckDuration(timeout); err != nil {
		return time.Time{}, err
	}
	if timeout == 0 {
		if m.cfg.MaxTimeout > 0 {
			return time.Time{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "a sandbox without deadline is not allowed: the server maximum timeout is %s", m.cfg.MaxTimeout)
		}
		return time.Time{}, nil
	}
	if m.cfg.MaxTimeout > 0 && timeout > m.cfg.MaxTimeout {
		return time.Time{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout %s exceeds the server maximum %s", timeout, m.cfg.MaxTimeout)
	}
	return now.Add(timeout).UTC(), nil
}

func (m *Manager) runtimeNames() []string {
	var names []string
	for n := range m.drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (m *Manager) newAgent(drv driver.Driver, id string) *agent.Client {
	return agent.New(func(ctx context.Context) (net.Conn, error) { return drv.DialAgent(ctx, id) })
}

// warmAgent makes one health round trip to a new sandbox's agent in the
// background while the create answers its caller, so that the caller's
// first request finds a connection open and the agent's request handling
// run once: the first exec of a new sandbox waited 0.6-0.8 ms longer
// without it (n=80-100). Close cancels it and waits for it, like the
// network teardowns.
func (m *Manager) warmAgent(c *agent.Client) {
	m.bgMu.Lock()
	defer m.bgMu.Unlock()
	if m.bgClosed {
		return
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		go func() {
			select {
			case <-m.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		_, _ = c.Health(ctx)
	}()
}

// Get returns a copy of one sandbox.
func (m *Manager) Get(id string) (Sandbox, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e.sb.clone(), nil
}

// List returns copies of the sandboxes matching f, oldest first.
func (m *Manager) List(f Filter) []Sandbox {
	m.mu.RLock()
	out := make([]Sandbox, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		if f.match(e.sb) {
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

// Delete destroys a sandbox and releases everything it holds. It works from
// every state and is idempotent: deleting an unknown ID returns an error
// wrapping errdefs.ErrNotFound and changes nothing. The work is not aborted
// when ctx is canceled halfway, so a client that goes away cannot leave a
// half-deleted sandbox.
func (m *Manager) Delete(ctx context.Context, id string) error {
	e, _, unlock, err := m.lockEntry(id)
	if err != nil {
		return err
	}
	defer unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	sb, err := m.transition(ctx, e, move{to: StateDeleting})
	if err != nil {
		return err
	}
	if err := m.release(ctx, sb.Runtime, id); err != nil {
		m.setError(ctx, e, err)
		return err
	}
	if e.agent != nil {
		e.agent.Close()
	}
	m.forget(ctx, id)
	m.emit(events.Deleted, sb, nil)
	if m.managedNetwork(sb) {
		m.releaseNetworkLater(id)
	}
	m.log.Info("sandbox deleted", "sandbox_id", id)
	return nil
}

// release frees the instance and the root of sandbox id.
func (m *Manager) release(ctx context.Context, runtime, id string) error {
	var errs []error
	if drv, ok := m.drivers[runtime]; ok {
		if err := drv.Delete(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("deleting instance of sandbox %s: %w", id, err))
		}
	}
	if err := m.cfg.Storage.DeleteRoot(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("deleting root of sandbox %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// forget drops a sandbox from memory and the store.
func (m *Manager) forget(ctx context.Context, id string) {
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.mu.Unlock()
	m.adm.release(id)
	if err := m.cfg.Store.DeleteSandbox(ctx, id); err != nil {
		m.log.Error("forgetting sandbox", "sandbox_id", id, "err", err)
	}
}

func (m *Manager) setError(ctx context.Context, e *entry, cause error) {
	if _, err := m.transition(ctx, e, move{to: StateError, cause: cause, event: events.Error}); err != nil {
		m.log.Error("recording sandbox error", "sandbox_id", e.sb.ID, "err", err)
	}
}

func (m *Manager) entry(id string) (*entry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e, nil
}

// SetTimeout sets a sandbox's deadline to now+timeout (0: no deadline, when
// the server allows it). This is the only way a deadline changes.
func (m *Manager) SetTimeout(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	e, _, unlock, err := m.lockEntry(id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	deadline, err := m.deadline(m.cfg.Now(), timeout)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	if e.sb.State == StateDeleting || e.sb.State == StateCreating {
		st := e.sb.State
		m.mu.Unlock()
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s", id, st)
	}
	e.sb.Deadline = deadline
	sb := e.sb.clone()
	m.mu.Unlock()
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording timeout of sandbox %s: %w", id, err)
	}
	return sb, nil
}

// Agent returns the agent client of a running sandbox, for file
// operations. The client stays owned by the Manager.
func (m *Manager) Agent(id string) (*agent.Client, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if e.sb.State != StateRunning || e.agent == nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, e.sb.State)
	}
	e.act.touch(m.cfg.Now())
	return e.agent, nil
}

// Exec runs a process in a running sandbox and calls fn for each event. The
// sandbox's environment is the base of the process's; req.Env overrides it.
// When a process dies of SIGKILL and the sandbox's OOM-kill count rose
// meanwhile, the exit event says OOMKilled.
func (m *Manager) Exec(ctx context.Context, id string, req wire.ExecRequest, fn func(wire.ExecEvent) error) error {
	e, client, runtime, err := m.running(id, &req)
	if err != nil {
		return err
	}
	if err := m.checkExec(&req); err != nil {
		return err
	}
	before, oomErr := oomKills(ctx, m.drivers[runtime], id)
	err = m.exec(ctx, execTarget{e: e, id: id, runtime: runtime, client: client}, req, before, oomErr, fn)
	if errors.Is(err, errdefs.ErrUnavailable) {
		m.checkAlive(context.WithoutCancel(ctx), e)
	}
	return err
}

// checkExec checks req's numeric fields against their ranges and its
// output limit against the server's, and sets the default limit where
// req has none.
func (m *Manager) checkExec(req *wire.ExecRequest) error {
	if err := execRanges(*req); err != nil {
		return err
	}
	switch {
	case m.cfg.MaxExecOutput > 0 && req.MaxOutputBytes > m.cfg.MaxExecOutput:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "max_output_bytes %d exceeds the server maximum %d", req.MaxOutputBytes, m.cfg.MaxExecOutput)
	case req.MaxOutputBytes == 0 && m.cfg.ExecOutput > 0:
		req.MaxOutputBytes = m.cfg.ExecOutput
	}
	return nil
}

// execRanges checks req's numeric fields against their ranges.
func execRanges(req wire.ExecRequest) error {
	if err := RangeExecTimeout.Check(req.TimeoutMS); err != nil {
		return err
	}
	return RangeExecOutput.Check(req.MaxOutputBytes)
}

// execTarget is the sandbox an exec runs in: its entry, ID and runtime,
// and the client of its agent. early marks an exec sent while the sandbox
// was being created (Run), whose start latency includes the create's and
// is kept out of the exec start metric.
type execTarget struct {
	e       *entry
	id      string
	runtime string
	client  *agent.Client
	early   bool
}

// exec runs the checked request req in t; before is the sandbox's OOM-kill
// count when the request was made (oomErr when it could not be read). The
// caller checks whether an unavailable agent means a dead sandbox
// (checkAlive), which a sandbox still being created is not.
func (m *Manager) exec(ctx context.Context, t execTarget, req wire.ExecRequest, before int64, oomErr error, fn func(wire.ExecEvent) error) error {
	e, id, runtime, client := t.e, t.id, t.runtime, t.client
	defer m.busy(e)()
	drv := m.drivers[runtime]
	start, started := time.Now(), false
	return client.Exec(ctx, req, func(ev wire.ExecEvent) error {
		if !started && ev.Type == wire.EventStart {
			started = true
			if !t.early {
				m.met.ExecStartSeconds.Observe(time.Since(start).Seconds(), runtime)
			}
		}
		if ev.Type == wire.EventExit && ev.Signal == "SIGKILL" && oomErr == nil {
			if after, err := oomKills(ctx, drv, id); err == nil && after > before {
				ev.OOMKilled = true
			}
		}
		return fn(ev)
	})
}

// oomKills reads instance id's OOM-kill count, through
// driver.OOMCounter where drv has it (Stats of gVisor asks the agent too).
func oomKills(ctx context.Context, drv driver.Driver, id string) (int64, error) {
	if c, ok := drv.(driver.OOMCounter); ok {
		return c.OOMKills(ctx, id)
	}
	st, err := drv.Stats(ctx, id)
	return st.OOMKills, err
}

// StartProcess starts a process that outlives the request (see
// agent.Client.StartProcess) in a running sandbox. As with Exec, the
// sandbox's environment is the base of the process's.
func (m *Manager) StartProcess(ctx context.Context, id string, req wire.StartRequest) (wire.ProcessInfo, error) {
	if err := execRanges(req.ExecRequest); err != nil {
		return wire.ProcessInfo{}, err
	}
	if p := req.PTY; p != nil {
		if err := errors.Join(RangePTYCols.Check(int64(p.Cols)), RangePTYRows.Check(int64(p.Rows))); err != nil {
			return wire.ProcessInfo{}, err
		}
	}
	e, client, _, err := m.running(id, &req.ExecRequest)
	if err != nil {
		return wire.ProcessInfo{}, err
	}
	info, err := client.StartProcess(ctx, req)
	if errors.Is(err, errdefs.ErrUnavailable) {
		m.checkAlive(context.WithoutCancel(ctx), e)
	}
	return info, err
}

// running returns a running sandbox's entry, agent and runtime, and fills
// in what req leaves to the sandbox and its template (withDefaults).
func (m *Manager) running(id string, req *wire.ExecRequest) (*entry, *agent.Client, string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" {
		return nil, nil, "", errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if e.sb.State != StateRunning || e.agent == nil {
		return nil, nil, "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running", id, e.sb.State)
	}
	e.act.touch(m.cfg.Now())
	m.execDefaults(e, req)
	return e, e.agent, e.sb.Runtime, nil
}

// execDefaults fills in what req leaves to the sandbox of e: its
// template's and its own defaults, then its network's proxy environment
// under them. The caller holds m.mu.
func (m *Manager) execDefaults(e *entry, req *wire.ExecRequest) {
	m.withDefaults(e.sb, req)
	withNetworkEnv(e, req)
}

// checkAlive marks a sandbox as errored when its instance is gone, so that
// a dead sandbox says so instead of timing out on every call.
func (m *Manager) checkAlive(ctx context.Context, e *entry) {
	m.mu.RLock()
	id, runtime, state := e.sb.ID, e.sb.Runtime, e.sb.State
	m.mu.RUnlock()
	if state != StateRunning {
		return
	}
	st, err := m.drivers[runtime].Status(ctx, id)
	if err != nil || st == driver.StatusRunning || st == driver.StatusPaused {
		return
	}
	_, unlock, err := m.lock(e, id)
	if err != nil { // deleted meanwhile
		return
	}
	defer unlock()
	m.setError(ctx, e, fmt.Errorf("sandbox %s stopped unexpectedly (instance is %s)", id, st))
}

// Stats reads a running sandbox's resource usage.
func (m *Manager) Stats(ctx context.Context, id string) (driver.Stats, error) {
	sb, err := m.Get(id)
	if err != nil {
		return driver.Stats{}, err
	}
	return m.drivers[sb.Runtime].Stats(ctx, id)
}

// ValidateTemplateName reports whether name can name a template: lower-case
// letters, digits, '.', '_' and '-', starting with a letter or digit, at
// most 63 characters.
func ValidateTemplateName(name string) error {
	ok := len(name) > 0 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			ok = false
		}
	}
	if !ok {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid template name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	return nil
}

// CreateTemplate makes a template named name by calling fill on an empty
// directory, and records it. Names are lower-case letters, digits, '.', '_'
// and '-', at most 63 characters.
func (m *Manager) CreateTemplate(ctx context.Context, name, source string, fill func(dir string) error) (Template, error) {
	return m.CreateTemplateFrom(ctx, Template{Name: name, Source: source}, fill)
}

// CreateTemplateFrom is CreateTemplate for a record that says more than a
// name and a source (image, digest, defaults); its CreatedAt is set here.
func (m *Manager) CreateTemplateFrom(ctx context.Context, t Template, fill func(dir string) error) (Template, error) {
	name := t.Name
	if err := ValidateTemplateName(name); err != nil {
		return Template{}, err
	}
	m.mu.RLock()
	_, exists := m.templates[name]
	m.mu.RUnlock()
	if exists {
		return Template{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name)
	}
	prepared := func(dir string) error {
		if err := fill(dir); err != nil {
			return err
		}
		for _, d := range m.drivers {
			if p, ok := d.(driver.TemplatePreparer); ok {
				if err := p.PrepareTemplate(dir); err != nil {
					return fmt.Errorf("preparing template %q for %s: %w", name, d.Name(), err)
				}
			}
		}
		return nil
	}
	if err := m.cfg.Storage.CreateTemplate(ctx, name, prepared); err != nil {
		return Template{}, fmt.Errorf("creating template %q: %w", name, err)
	}
	t = t.clone()
	t.CreatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.PutTemplate(ctx, t); err != nil {
		if derr := m.cfg.Storage.DeleteTemplate(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Error("rolling back template", "template", name, "err", derr)
		}
		return Template{}, fmt.Errorf("recording template %q: %w", name, err)
	}
	m.mu.Lock()
	m.templates[name] = t
	m.mu.Unlock()
	return t.clone(), nil
}

// DeleteTemplate removes a template that no sandbox uses.
func (m *Manager) DeleteTemplate(ctx context.Context, name string) error {
	if err := m.checkNoPoolUses(name); err != nil {
		return err
	}
	m.mu.Lock()
	if _, ok := m.templates[name]; !ok {
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
	}
	var users []string
	for id, e := range m.sandboxes {
		if e.sb.Template == name {
			users = append(users, id)
		}
	}
	if len(users) > 0 {
		m.mu.Unlock()
		slices.Sort(users)
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q is used by %d sandbox(es): %s", name, len(users), strings.Join(users, ", "))
	}
	if snaps := m.snapshotUsers(name); len(snaps) > 0 {
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q is used by %d snapshot(s): %s", name, len(snaps), strings.Join(snaps, ", "))
	}
	delete(m.templates, name)
	m.mu.Unlock()
	if err := m.cfg.Storage.DeleteTemplate(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("deleting template %q: %w", name, err)
	}
	if err := m.cfg.Store.DeleteTemplate(ctx, name); err != nil {
		return fmt.Errorf("forgetting template %q: %w", name, err)
	}
	return nil
}

// Templates lists templates by name.
func (m *Manager) Templates() []Template {
	m.mu.RLock()
	out := make([]Template, 0, len(m.templates))
	for _, t := range m.templates {
		out = append(out, t.clone())
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Template returns one template.
func (m *Manager) Template(name string) (Template, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, ok := m.templates[name]
	if !ok {
		return Template{}, errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
	}
	return t.clone(), nil
}

// newID returns a random sandbox ID: 16 lower-case base32 characters, safe
// as a file name, a hostname and a runtime container ID.
func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}
