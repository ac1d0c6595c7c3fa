package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/undo"
)

// Create makes a sandbox and returns it running. It records the sandbox
// before the instance starts (while its storage and network are made), and
// on failure (including ctx being canceled) releases everything it
// acquired and forgets the sandbox.
//
// A spec that matches a warm pool (pool.go) gets a sandbox from it when one
// is ready (claim), and a cold create otherwise. With spec.FromSnapshot it starts
// from a snapshot (createFromSnapshot).
func (m *Manager) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	return m.createWith(ctx, spec, nil)
}

// createWith is Create, which hands started to a cold create (see create).
func (m *Manager) createWith(ctx context.Context, spec Spec, started startedFunc) (Sandbox, error) {
	if err := m.checkSecrets(ctx, tenancy.Owner(ctx), spec.Network); err != nil {
		return Sandbox{}, err
	}
	if spec.FromSnapshot != "" {
		if len(spec.Mounts) > 0 {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "mounts: a sandbox from a snapshot takes none")
		}
		return m.createFromSnapshot(ctx, spec)
	}
	if def, ok := m.poolDef(spec.Pool); ok {
		// The quota counts the limits the pool gives (claim fits them
		// again, against the pool as it is then).
		var err error
		if spec, err = fitPool(spec, def); err != nil {
			return Sandbox{}, err
		}
	}
	release, err := m.reserveQuota(ctx, spec.limits(), 1)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	if len(spec.Mounts) > 0 {
		// A pool's sandboxes started without the caller's mounts.
		if spec.Pool != "" {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "mounts: a sandbox claimed from pool %q takes none", spec.Pool)
		}
		return m.createSpec(ctx, spec, nil, started)
	}
	spec, sb, claimed, err := m.claim(ctx, spec)
	if err != nil || claimed {
		return sb, err
	}
	return m.createSpec(ctx, spec, nil, started)
}

// limits returns spec's limits.
func (spec Spec) limits() Limits {
	return Limits{MilliCPUs: spec.MilliCPUs, MemoryBytes: spec.MemoryBytes, Pids: spec.Pids, DiskBytes: spec.DiskBytes}
}

// createSpec admits spec for ctx's caller and creates it (see create).
func (m *Manager) createSpec(ctx context.Context, spec Spec, src *restoreSource, started startedFunc) (Sandbox, error) {
	sb, drv, err := m.admit(ctx, spec)
	if err != nil {
		return Sandbox{}, err
	}
	sb.createdBy(ctx)
	if src == nil {
		return m.createFresh(ctx, sb, drv, started)
	}
	return m.create(ctx, sb, drv, src, started)
}

// createdBy makes the caller of ctx sb's creator: its tenant owns sb,
// its key and admission principal are sb's.
func (sb *Sandbox) createdBy(ctx context.Context) {
	p, _ := tenancy.From(ctx)
	sb.Owner, sb.Tenant, sb.Key = admission.Principal(ctx), p.Tenant, p.Key
}

// admit validates spec, applies defaults and bounds, and returns the new
// sandbox record (state creating) and its driver.
func (m *Manager) admit(ctx context.Context, spec Spec) (Sandbox, driver.Driver, error) {
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
	_, err := m.templateOf(ctx, spec.Template)
	m.mu.RUnlock()
	if err != nil {
		return Sandbox{}, nil, err
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Sandbox{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid environment variable name %q", k)
		}
	}
	lim := spec.limits()
	lim, err = m.bound(lim)
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
	policy, err := m.resolvePolicy(spec.Network, mode, egress.Policy{})
	if err != nil {
		return Sandbox{}, nil, err
	}
	mounts, err := m.admitMounts(spec.Mounts)
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
		Mounts:      mounts,
		IdleTimeout: *life.IdleTimeout,
		OnDeadline:  life.OnDeadline,
		OnIdle:      life.OnIdle,
	}, drv, nil
}

// newID returns a random sandbox ID: 16 lower-case base32 characters, safe
// as a file name, a hostname and a runtime container ID.
func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
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

// startedFunc is told, at most once and from the driver's Create, that the
// sandbox of entry e is reachable through its agent client c, which the
// sandbox keeps once running (driver.Spec.Started). It must not block.
type startedFunc func(e *entry, c *agentclient.Client)

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
	done, err := m.adm.Reserve(ctx, sb.ID, claimOf(sb))
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
// says when to retry) or a caller that gave up as a warning, anything
// else as an error. A sandbox without an ID is a create refused before it
// got one.
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
// is how long admission took. On failure it releases what it acquired,
// newest first, then forgets the sandbox and, once it was recorded,
// emits its deletion; a release that fails is logged rather than
// returned, because the create's own error is what its caller acts on.
func (m *Manager) build(ctx context.Context, sb Sandbox, drv driver.Driver, src *restoreSource, started startedFunc, waited time.Duration) (_ Sandbox, err error) {
	e := &entry{sb: sb}
	e.op.Lock()
	defer e.op.Unlock()

	m.mu.Lock()
	m.sandboxes[sb.ID] = e
	m.mu.Unlock()

	var u undo.Stack
	recorded := false
	u.Add(func(ctx context.Context) error {
		m.forget(ctx, sb.ID)
		if recorded {
			m.emit(events.Deleted, sb, err)
		}
		return nil
	})
	defer func() {
		if err == nil {
			u.Keep()
			return
		}
		if uerr := u.Undo(ctx); uerr != nil {
			m.log.Error("rolling back sandbox create", "sandbox_id", sb.ID, "err", uerr)
		}
	}()

	start := time.Now()
	set, err := m.setup(ctx, &u, sb, src)
	recorded = set.recorded
	if err != nil {
		return Sandbox{}, err
	}
	if set.network != nil {
		m.mu.Lock()
		e.netEnv = set.network.Env
		m.mu.Unlock()
	}
	if set.mounts, err = m.prepareMounts(ctx, &u, drv, sb, set.root); err != nil {
		return Sandbox{}, err
	}
	setupDone := time.Now()
	ag := m.newAgent(drv, sb.ID)
	sv := m.serviceToStart(sb.Template, src)
	if sv != nil {
		started = nil // nothing runs before the service is ready
	}
	if err := m.launch(ctx, &u, drv, e, ag, set, src, started); err != nil {
		return Sandbox{}, err
	}
	driverDone := time.Now()
	if err := ctx.Err(); err != nil {
		return Sandbox{}, fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	if err := m.startService(ctx, ag, sb, netEnvOf(set.network), sv); err != nil {
		return Sandbox{}, err
	}

	if started == nil {
		m.warmAgent(ag)
	}
	running, err := m.transition(ctx, e, move{to: StateRunning, event: events.Running, edit: func(e *entry) { e.agent = ag }})
	if err != nil {
		return Sandbox{}, err
	}
	m.met.CreateSeconds.Observe(time.Since(start).Seconds(), running.Runtime)
	m.log.Info("sandbox created", "sandbox_id", running.ID, "runtime", running.Runtime, "template", running.Template,
		"duration_ms", time.Since(start).Milliseconds(), "wait_ms", waited.Milliseconds(), "storage_ms", set.storageDone.Sub(start).Milliseconds(),
		"network_ms", set.networkDone.Sub(start).Milliseconds(), "driver_ms", driverDone.Sub(setupDone).Milliseconds())
	return running, nil
}

// setupResult is what setup made for a sandbox's instance, and when its
// storage and network were done.
type setupResult struct {
	sb       Sandbox
	root     string
	template string          // the template's tree while root is its unchanged copy
	network  *driver.Network // nil without a managed network
	mounts   []driver.Mount
	recorded bool // the record is in the store, even when setup failed

	storageDone, networkDone time.Time
}

// setup makes what sandbox sb's instance needs: its record, its root
// (with src's files) and its network. They do not depend on each other,
// so they are made at once; the instance starts only once the record is
// in, and a crash before that leaves a root and a network that no record
// names, which reconcile removes as orphans. Each resource's release is
// on u once the resource exists.
func (m *Manager) setup(ctx context.Context, u *undo.Stack, sb Sandbox, src *restoreSource) (setupResult, error) {
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
	s := setupResult{sb: sb}
	var err error
	s.root, err = m.makeRoot(ctx, u, sb, src)
	s.storageDone = time.Now()
	if src == nil {
		s.template = m.cfg.Storage.TemplatePath(sb.Template)
	}
	if rerr := <-recordc; rerr != nil {
		err = errors.Join(fmt.Errorf("recording sandbox %s: %w", sb.ID, rerr), err)
	} else {
		s.recorded = true
		m.emit(events.Created, sb, nil)
	}
	nr := <-netc
	s.network, s.networkDone = nr.spec, nr.done
	if nr.err == nil {
		u.Add(func(ctx context.Context) error {
			if err := m.releaseNetwork(ctx, sb.ID); err != nil {
				return fmt.Errorf("releasing network of sandbox %s: %w", sb.ID, err)
			}
			return nil
		})
	}
	// Both may fail: the storage error first, the network's (which names
	// the sandbox already) joined to it.
	return s, errors.Join(err, nr.err)
}

// makeRoot creates sandbox sb's root and replays src's files on it, and
// registers the root's release on u once the root exists.
func (m *Manager) makeRoot(ctx context.Context, u *undo.Stack, sb Sandbox, src *restoreSource) (string, error) {
	opts := storage.RootOptions{DiskBytes: sb.DiskBytes}
	var err error
	if opts.IDMap, err = m.reserveIDs(ctx, u, sb); err != nil {
		return "", err
	}
	root, err := m.cfg.Storage.CreateRoot(ctx, sb.ID, sb.Template, opts)
	if opts.IDMap != nil {
		opts.IDMap.Close()
	}
	if err != nil {
		return "", fmt.Errorf("creating root of sandbox %s: %w", sb.ID, err)
	}
	u.Add(func(ctx context.Context) error {
		if err := m.cfg.Storage.DeleteRoot(ctx, sb.ID); err != nil {
			return fmt.Errorf("deleting root of sandbox %s: %w", sb.ID, err)
		}
		return nil
	})
	if src != nil {
		if err := src.applyFiles(ctx, root, m.rootShift(sb, root)); err != nil {
			return "", fmt.Errorf("restoring files of sandbox %s: %w", sb.ID, err)
		}
	}
	return root, nil
}

// launch starts the instance of entry e on drv from what setup made, and
// registers its release on u. started, when set, learns from the driver
// that agent client ag can take requests; a call after launch returned
// starts nothing.
func (m *Manager) launch(ctx context.Context, u *undo.Stack, drv driver.Driver, e *entry, ag *agentclient.Client, s setupResult, src *restoreSource, started startedFunc) error {
	id := s.sb.ID
	dspec := driver.Spec{
		ID:       id,
		RootFS:   s.root,
		Template: s.template,
		Hostname: id,
		Resources: driver.Resources{
			MilliCPUs:   s.sb.MilliCPUs,
			MemoryBytes: s.sb.MemoryBytes,
			Pids:        s.sb.Pids,
		},
		Network: s.network,
		Mounts:  s.mounts,
	}
	var once sync.Once
	if started != nil {
		dspec.Started = func() { once.Do(func() { started(e, ag) }) }
	}
	err := m.startInstance(ctx, drv, dspec, src)
	once.Do(func() {}) // a late call starts nothing
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	u.Add(func(ctx context.Context) error {
		if err := drv.Delete(ctx, id); err != nil {
			return fmt.Errorf("deleting instance of sandbox %s: %w", id, err)
		}
		return nil
	})
	return nil
}

// startInstance starts the driver instance of a new sandbox: a restore of
// src's memory image when it has one, a fresh start otherwise.
func (m *Manager) startInstance(ctx context.Context, drv driver.Driver, spec driver.Spec, src *restoreSource) error {
	if src == nil || !src.memory {
		return drv.Create(ctx, spec)
	}
	c, ok := drv.(driver.Checkpointer)
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot restore memory", drv.Name())
	}
	return c.Restore(ctx, spec.ID, spec, filepath.Join(src.dir, snapshotdir.MemoryDir))
}

func (m *Manager) newAgent(drv driver.Driver, id string) *agentclient.Client {
	return agentclient.New(func(ctx context.Context) (net.Conn, error) { return drv.DialAgent(ctx, id) })
}

// warmAgent makes one health round trip to a new sandbox's agent in the
// background while the create answers its caller, so that the caller's
// first request finds a connection open and the agent's request handling
// run once, and does not pay for either. Close cancels it and waits for
// it, like the network teardowns.
func (m *Manager) warmAgent(c *agentclient.Client) {
	m.bgMu.Lock()
	defer m.bgMu.Unlock()
	if m.bgClosed {
		return
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		ctx, cancel := m.untilClose()
		defer cancel()
		ctx, cancelTimeout := context.WithTimeout(ctx, 5*time.Second)
		defer cancelTimeout()
		_, _ = c.Health(ctx)
	}()
}
