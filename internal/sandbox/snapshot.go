package sandbox

import (
	"context"
	"errors"
	"fmt"
	"github.com/corralrun/corral/internal/events"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/snapshot"
	"github.com/corralrun/corral/internal/storage"
)

// Snapshot kinds: what a snapshot holds, and so what a sandbox made from
// it gets.
const (
	// SnapshotFilesystem holds the files only; sandboxes made from it
	// start fresh processes on a copy of them.
	SnapshotFilesystem = "filesystem"
	// SnapshotMemory holds files, memory and kernel state; sandboxes made
	// from it continue the processes that ran at snapshot time.
	SnapshotMemory = "memory"
)

// MaxForks bounds the copies one Fork makes.
const MaxForks = 16

// Snapshot is the record of one snapshot. It outlives its source sandbox
// and carries what a sandbox made from it needs.
type Snapshot struct {
	Name string `json:"name"`
	// Kind is SnapshotFilesystem or SnapshotMemory.
	Kind        string            `json:"kind"`
	SandboxID   string            `json:"sandbox_id"`
	Template    string            `json:"template"`
	Runtime     string            `json:"runtime"`
	MilliCPUs   int64             `json:"milli_cpus"`
	MemoryBytes int64             `json:"memory_bytes"`
	Pids        int64             `json:"pids"`
	DiskBytes   int64             `json:"disk_bytes,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	// SizeBytes is the size of the snapshot's files on disk.
	SizeBytes int64 `json:"size_bytes"`
}

func (s Snapshot) clone() Snapshot {
	s.Env = cloneMap(s.Env)
	s.Metadata = cloneMap(s.Metadata)
	return s
}

// SnapshotSpec is what a caller asks for when snapshotting a sandbox.
type SnapshotSpec struct {
	// Name names the snapshot; the rules of template names apply.
	Name     string
	Metadata map[string]string
}

// SnapshotStore persists snapshot records. A Store that implements it
// enables snapshots; Put and Delete must be durable when they return.
type SnapshotStore interface {
	PutSnapshot(ctx context.Context, s Snapshot) error
	DeleteSnapshot(ctx context.Context, name string) error
	Snapshots(ctx context.Context) ([]Snapshot, error)
}

// snapshots is the Manager's view of the published snapshots. pending
// reserves the names of snapshots being written or deleted; readers
// counts the restores using each snapshot; a delete is refused meanwhile.
type snapshots struct {
	mu      sync.Mutex
	byName  map[string]Snapshot
	pending map[string]bool
	readers map[string]int
}

// restoreSource is what a sandbox is made from besides its template: a
// snapshot directory (published or the temporary one of a fork).
type restoreSource struct {
	dir    string
	memory bool
}

// SnapshotKind says what kind of snapshot a sandbox of runtime rt gives:
// SnapshotMemory when its driver checkpoints memory, SnapshotFilesystem
// when storage can save the files, "" when snapshots are unavailable.
func (m *Manager) SnapshotKind(rt string) string {
	drv, ok := m.drivers[rt]
	if !ok || m.snapshotStore() == nil || m.cfg.SnapshotDir == "" {
		return ""
	}
	if _, ok := m.cfg.Storage.(storage.Changes); !ok {
		return ""
	}
	if _, ok := drv.(driver.Checkpointer); ok && drv.Capabilities().Checkpoint {
		return SnapshotMemory
	}
	return SnapshotFilesystem
}

func (m *Manager) snapshotStore() SnapshotStore {
	s, _ := m.cfg.Store.(SnapshotStore)
	return s
}

func (m *Manager) snapshotDir(name string) string { return filepath.Join(m.cfg.SnapshotDir, name) }

// Pause freezes every process of a running sandbox (the freezer cgroup
// for runc, gVisor's own pause). Its memory stays in use; exec and file
// calls fail with ErrFailedPrecondition until Resume. The deadline keeps
// running. Drivers without the ability return ErrNotImplemented.
func (m *Manager) Pause(ctx context.Context, id string) (Sandbox, error) {
	e, sb, unlock, err := m.lockEntry(id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if err := checkMove(id, sb.State, StatePaused); err != nil { // before the driver freezes it
		return Sandbox{}, err
	}
	p, err := m.driverPauser(sb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Pause(ctx, id); err != nil {
		return Sandbox{}, fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	sb, err = m.transition(ctx, e, move{to: StatePaused, event: events.Paused})
	if err != nil {
		rerr := p.Resume(context.WithoutCancel(ctx), id)
		if _, uerr := m.transition(ctx, e, move{to: StateRunning, undo: true}); uerr != nil {
			rerr = errors.Join(rerr, uerr)
		}
		return Sandbox{}, errors.Join(err, rerr)
	}
	m.log.Info("sandbox paused", "sandbox_id", id)
	return sb, nil
}

// Resume thaws a paused sandbox and sets its deadline to now plus the
// server's default timeout, so that a sandbox paused at its deadline does
// not expire at once; ResumeFor takes the timeout explicitly.
func (m *Manager) Resume(ctx context.Context, id string) (Sandbox, error) {
	return m.ResumeFor(ctx, id, m.cfg.DefaultTimeout)
}

// ResumeFor thaws a paused sandbox and sets its deadline to now+timeout
// (0: no deadline, when the server allows it), as SetTimeout does.
func (m *Manager) ResumeFor(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	deadline, err := m.deadline(m.cfg.Now(), timeout)
	if err != nil {
		return Sandbox{}, err
	}
	e, sb, unlock, err := m.lockEntry(id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.State != StatePaused {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not paused", id, sb.State)
	}
	p, err := m.driverPauser(sb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Resume(ctx, id); err != nil {
		return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	e.savedPaused = false
	sb, err = m.transition(ctx, e, move{to: StateRunning, event: events.Resumed, edit: func(e *entry) { e.sb.Deadline = deadline }})
	if err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox resumed", "sandbox_id", id)
	return sb, nil
}

// lockEntry looks sandbox id up, locks its op and returns its entry, a
// copy of its record and the unlock function. A sandbox deleted while the
// caller waited for op answers errdefs.ErrNotFound, as an unknown one does.
func (m *Manager) lockEntry(id string) (*entry, Sandbox, func(), error) {
	e, err := m.entry(id)
	if err != nil {
		return nil, Sandbox{}, nil, err
	}
	sb, unlock, err := m.lock(e, id)
	if err != nil {
		return nil, Sandbox{}, nil, err
	}
	return e, sb, unlock, nil
}

// lock is lockEntry for a caller that already holds sandbox id's entry.
func (m *Manager) lock(e *entry, id string) (Sandbox, func(), error) {
	if m.beforeLock != nil {
		m.beforeLock(id)
	}
	e.op.Lock()
	sb, err := m.current(e, id)
	if err != nil {
		e.op.Unlock()
		return Sandbox{}, nil, err
	}
	return sb, e.op.Unlock, nil
}

// current returns e's record, or ErrNotFound when the sandbox was deleted
// while the caller waited for e.op.
func (m *Manager) current(e *entry, id string) (Sandbox, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.sandboxes[id] != e {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return e.sb.clone(), nil
}

func (m *Manager) driverPauser(sb Sandbox) (driver.Pauser, error) {
	p, ok := m.drivers[sb.Runtime].(driver.Pauser)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "runtime %s cannot pause sandboxes", sb.Runtime)
	}
	return p, nil
}

// Snapshot saves a running or paused sandbox under spec.Name: its files,
// and on runtimes that checkpoint memory (SnapshotKind) its memory and
// processes too. The sandbox is frozen while its files are read (and
// its memory saved), then continues in the state it had. The snapshot is
// written and synced under a temporary name, checksummed, renamed and
// then recorded: a crash at any point leaves the sandbox as it was (a
// restarted daemon thaws it) and no partial snapshot listed. The cost is
// a freeze for the time it takes to copy the sandbox's changed files (and
// its memory image), plus a checksum pass over them after the thaw.
func (m *Manager) Snapshot(ctx context.Context, id string, spec SnapshotSpec) (Snapshot, error) {
	if err := ValidateTemplateName(spec.Name); err != nil {
		return Snapshot{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid snapshot name %q: use lower-case letters, digits, '.', '_' and '-'", spec.Name)
	}
	e, err := m.entry(id)
	if err != nil {
		return Snapshot{}, err
	}
	sb, err := m.current(e, id)
	if err != nil {
		return Snapshot{}, err
	}
	kind := m.SnapshotKind(sb.Runtime)
	if kind == "" {
		return Snapshot{}, errdefs.Errorf(errdefs.ErrNotImplemented, "snapshots are not available for runtime %s with %s storage", sb.Runtime, m.cfg.Storage.Name())
	}
	if err := m.reserveSnapshot(spec.Name); err != nil {
		return Snapshot{}, err
	}
	defer m.releaseSnapshot(spec.Name)

	start := time.Now()
	tmp, err := snapshot.TempDir(m.cfg.SnapshotDir, spec.Name)
	if err != nil {
		return Snapshot{}, err
	}
	published := false
	defer func() {
		if !published {
			if err := os.RemoveAll(tmp); err != nil {
				m.log.Error("removing unfinished snapshot", "snapshot", spec.Name, "err", err)
			}
		}
	}()
	sb, err = m.capture(ctx, e, id, tmp, kind == SnapshotMemory)
	if err != nil {
		return Snapshot{}, err
	}
	captured := time.Now()
	snap := Snapshot{
		Name: spec.Name, Kind: kind, SandboxID: id, Template: sb.Template, Runtime: sb.Runtime,
		MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes,
		Env: cloneMap(sb.Env), Metadata: cloneMap(spec.Metadata), CreatedAt: m.cfg.Now().UTC(),
	}
	manifest, err := snapshot.Seal(tmp, snap)
	if err != nil {
		return Snapshot{}, err
	}
	for _, f := range manifest.Files {
		snap.SizeBytes += f.Size
	}
	final := m.snapshotDir(spec.Name)
	if err := snapshot.Publish(tmp, final); err != nil {
		return Snapshot{}, err
	}
	published = true
	if err := m.snapshotStore().PutSnapshot(ctx, snap); err != nil {
		if rerr := snapshot.Remove(final); rerr != nil {
			m.log.Error("removing unrecorded snapshot", "snapshot", spec.Name, "err", rerr)
		}
		return Snapshot{}, fmt.Errorf("recording snapshot %s: %w", spec.Name, err)
	}
	m.snaps.mu.Lock()
	m.snaps.byName[spec.Name] = snap
	m.snaps.mu.Unlock()
	m.log.Info("snapshot created", "snapshot", spec.Name, "sandbox_id", id, "kind", kind,
		"size_bytes", snap.SizeBytes, "freeze_ms", captured.Sub(start).Milliseconds(), "duration_ms", time.Since(start).Milliseconds())
	return snap.clone(), nil
}

// capture writes the files (and with memory, the checkpoint image) of
// sandbox id into dir while the sandbox is frozen, and returns its record.
func (m *Manager) capture(ctx context.Context, e *entry, id, dir string, memory bool) (_ Sandbox, err error) {
	sb, unlock, err := m.lock(e, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.State != StateRunning && sb.State != StatePaused {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s and cannot be snapshotted", id, sb.State)
	}
	if sb.State == StateRunning {
		p, err := m.driverPauser(sb)
		if err != nil {
			return Sandbox{}, err
		}
		if err := p.Pause(ctx, id); err != nil {
			return Sandbox{}, fmt.Errorf("freezing sandbox %s for a snapshot: %w", id, err)
		}
		defer func() {
			if rerr := p.Resume(context.WithoutCancel(ctx), id); rerr != nil {
				rerr = fmt.Errorf("thawing sandbox %s after a snapshot: %w", id, rerr)
				m.setError(context.WithoutCancel(ctx), e, rerr)
				err = errors.Join(err, rerr)
			}
		}()
	}
	if memory && sb.State == StatePaused {
		// A second `runsc checkpoint` of a sandbox paused throughout
		// fails inside runsc (nil dereference while encoding, runsc
		// release-20260527.0); after a resume it works again.
		if e.savedPaused {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s was snapshotted or forked since it was paused; the runtime can save its memory once per pause: resume it first", id)
		}
		e.savedPaused = true
	}
	if memory {
		img := filepath.Join(dir, snapshot.MemoryDir)
		if err := os.Mkdir(img, 0o700); err != nil {
			return Sandbox{}, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
		}
		if err := m.drivers[sb.Runtime].(driver.Checkpointer).Checkpoint(ctx, id, img, true); err != nil {
			return Sandbox{}, err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, snapshot.ChangesName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Sandbox{}, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	err = snapshot.WriteChanges(ctx, f, m.cfg.Storage.(storage.Changes).ChangesPath(id))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("saving files of sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (m *Manager) reserveSnapshot(name string) error {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	if _, ok := m.snaps.byName[name]; ok || m.snaps.pending[name] {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "snapshot %q already exists", name)
	}
	m.snaps.pending[name] = true
	return nil
}

func (m *Manager) releaseSnapshot(name string) {
	m.snaps.mu.Lock()
	delete(m.snaps.pending, name)
	m.snaps.mu.Unlock()
}

// Snapshots lists the published snapshots by name.
func (m *Manager) Snapshots() []Snapshot {
	m.snaps.mu.Lock()
	out := make([]Snapshot, 0, len(m.snaps.byName))
	for _, s := range m.snaps.byName {
		out = append(out, s.clone())
	}
	m.snaps.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// GetSnapshot returns one snapshot.
func (m *Manager) GetSnapshot(name string) (Snapshot, error) {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	s, ok := m.snaps.byName[name]
	if !ok {
		return Snapshot{}, errdefs.Errorf(errdefs.ErrNotFound, "snapshot %q not found", name)
	}
	return s.clone(), nil
}

// DeleteSnapshot forgets a snapshot and removes its files. Sandboxes made
// from it are not affected.
func (m *Manager) DeleteSnapshot(ctx context.Context, name string) error {
	m.snaps.mu.Lock()
	if _, ok := m.snaps.byName[name]; !ok {
		m.snaps.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrNotFound, "snapshot %q not found", name)
	}
	if n := m.snaps.readers[name]; n > 0 || m.snaps.pending[name] {
		m.snaps.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "snapshot %q is in use by %d restore(s)", name, max(n, 1))
	}
	delete(m.snaps.byName, name)
	m.snaps.pending[name] = true // no new snapshot of that name until the files are gone
	m.snaps.mu.Unlock()
	defer m.releaseSnapshot(name)
	// Forget first: a crash after this leaves an unrecorded directory,
	// which the next start removes.
	if err := m.snapshotStore().DeleteSnapshot(ctx, name); err != nil {
		return fmt.Errorf("forgetting snapshot %s: %w", name, err)
	}
	return snapshot.Remove(m.snapshotDir(name))
}

// useSnapshot verifies snapshot name's checksums and returns its record
// and directory. The snapshot cannot be deleted until release; any number
// of restores may use it at once.
func (m *Manager) useSnapshot(name string) (Snapshot, string, func(), error) {
	m.snaps.mu.Lock()
	s, ok := m.snaps.byName[name]
	if ok {
		m.snaps.readers[name]++
	}
	m.snaps.mu.Unlock()
	if !ok {
		return Snapshot{}, "", nil, errdefs.Errorf(errdefs.ErrNotFound, "snapshot %q not found", name)
	}
	release := func() {
		m.snaps.mu.Lock()
		if m.snaps.readers[name]--; m.snaps.readers[name] == 0 {
			delete(m.snaps.readers, name)
		}
		m.snaps.mu.Unlock()
	}
	dir := m.snapshotDir(name)
	if _, err := snapshot.Verify(dir); err != nil {
		release()
		return Snapshot{}, "", nil, err
	}
	return s.clone(), dir, release, nil
}

// createFromSnapshot is Create for a spec with FromSnapshot: the
// template, the runtime and zero limits come from the snapshot, the
// snapshot's environment is the base of spec.Env, and the sandbox starts
// with the snapshot's files (and, for a memory snapshot, its processes).
func (m *Manager) createFromSnapshot(ctx context.Context, spec Spec) (Sandbox, error) {
	s, dir, release, err := m.useSnapshot(spec.FromSnapshot)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	if spec.Template != "" && spec.Template != s.Template {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %q is of template %q, not %q", s.Name, s.Template, spec.Template)
	}
	spec.Template = s.Template
	if spec.Runtime == "" {
		spec.Runtime = s.Runtime
	}
	if s.Kind == SnapshotMemory && spec.Runtime != s.Runtime {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %q holds the memory of a %s sandbox and restores only on %s", s.Name, s.Runtime, s.Runtime)
	}
	fillSpec(&spec, s)
	return m.createSpec(ctx, spec, &restoreSource{dir: dir, memory: s.Kind == SnapshotMemory}, nil)
}

// fillSpec fills spec's zero limits and environment from snapshot s.
func fillSpec(spec *Spec, s Snapshot) {
	for _, f := range []struct {
		dst *int64
		src int64
	}{
		{&spec.MilliCPUs, s.MilliCPUs}, {&spec.MemoryBytes, s.MemoryBytes}, {&spec.Pids, s.Pids}, {&spec.DiskBytes, s.DiskBytes},
	} {
		if *f.dst == 0 {
			*f.dst = f.src
		}
	}
	env := cloneMap(s.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	spec.Env = env
}

// applyFiles replays the source's saved files on root.
func (src *restoreSource) applyFiles(ctx context.Context, root string) error {
	f, err := os.Open(filepath.Join(src.dir, snapshot.ChangesName))
	if err != nil {
		return err
	}
	defer f.Close()
	return snapshot.Apply(ctx, f, root)
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
	return c.Restore(ctx, spec.ID, spec, filepath.Join(src.dir, snapshot.MemoryDir))
}

// Fork makes n copies of a running or paused sandbox. On runtimes that
// checkpoint memory each copy continues the source's processes from the
// moment of the fork; elsewhere each copy starts fresh processes on a copy
// of the source's files (SnapshotKind says which). The source is frozen
// only while its state is saved. The copies get the source's template,
// limits, environment, metadata and network policy, and the default
// timeout. Either all n copies are made or none is left.
func (m *Manager) Fork(ctx context.Context, id string, n int) ([]Sandbox, error) {
	if err := RangeForkCount.Check(int64(n)); err != nil {
		return nil, err
	}
	e, err := m.entry(id)
	if err != nil {
		return nil, err
	}
	sb, err := m.current(e, id)
	if err != nil {
		return nil, err
	}
	kind := m.SnapshotKind(sb.Runtime)
	if kind == "" {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "forks are not available for runtime %s with %s storage", sb.Runtime, m.cfg.Storage.Name())
	}
	tmp, err := snapshot.TempDir(m.cfg.SnapshotDir, "fork-"+id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := os.RemoveAll(tmp); err != nil {
			m.log.Error("removing fork image", "sandbox_id", id, "err", err)
		}
	}()
	start := time.Now()
	if sb, err = m.capture(ctx, e, id, tmp, kind == SnapshotMemory); err != nil {
		return nil, err
	}
	captured := time.Now()
	spec := Spec{
		Template: sb.Template, Runtime: sb.Runtime, MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes,
		Pids: sb.Pids, DiskBytes: sb.DiskBytes, Env: sb.Env, Metadata: sb.Metadata, Network: sb.Network,
	}
	src := &restoreSource{dir: tmp, memory: kind == SnapshotMemory}
	out := make([]Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = m.createSpec(ctx, spec, src, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, c := range out {
			if errs[i] == nil {
				if derr := m.Delete(context.WithoutCancel(ctx), c.ID); derr != nil {
					m.log.Error("rolling back fork", "sandbox_id", c.ID, "err", derr)
				}
			}
		}
		return nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	m.log.Info("sandbox forked", "sandbox_id", id, "count", n, "kind", kind,
		"duration_ms", time.Since(start).Milliseconds(), "capture_ms", captured.Sub(start).Milliseconds())
	return out, nil
}

// TemplateFromSnapshot makes template name from a snapshot's files: its
// template's tree with the snapshot's changes applied. Memory is not part
// of a template.
func (m *Manager) TemplateFromSnapshot(ctx context.Context, name, snapName string) (Template, error) {
	s, dir, release, err := m.useSnapshot(snapName)
	if err != nil {
		return Template{}, err
	}
	defer release()
	base := m.cfg.Storage.TemplatePath(s.Template)
	src := &restoreSource{dir: dir}
	return m.CreateTemplate(ctx, name, "snapshot:"+snapName, func(tree string) error {
		if err := snapshot.CopyTree(ctx, base, tree); err != nil {
			return fmt.Errorf("copying template %s: %w", s.Template, err)
		}
		return src.applyFiles(ctx, tree)
	})
}

// snapshotUsers lists the snapshots made on template name.
func (m *Manager) snapshotUsers(template string) []string {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	var out []string
	for n, s := range m.snaps.byName {
		if s.Template == template {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// reconcileSnapshots removes what interrupted snapshot writes and deletes
// left, drops records whose directory is gone, removes directories no
// record names (published but not recorded before a crash), and loads the
// rest. Checksums are verified when a snapshot is used, not here.
func (m *Manager) reconcileSnapshots(ctx context.Context) error {
	m.snaps.byName = make(map[string]Snapshot)
	m.snaps.pending = make(map[string]bool)
	m.snaps.readers = make(map[string]int)
	st := m.snapshotStore()
	if st == nil || m.cfg.SnapshotDir == "" {
		return nil
	}
	names, err := snapshot.Clean(m.cfg.SnapshotDir)
	if err != nil {
		return err
	}
	recs, err := st.Snapshots(ctx)
	if err != nil {
		return fmt.Errorf("loading snapshots: %w", err)
	}
	onDisk := make(map[string]bool, len(names))
	for _, n := range names {
		onDisk[n] = true
	}
	for _, s := range recs {
		if !onDisk[s.Name] {
			m.log.Warn("snapshot record without files; dropping it", "snapshot", s.Name)
			if err := st.DeleteSnapshot(ctx, s.Name); err != nil {
				return err
			}
			continue
		}
		m.snaps.byName[s.Name] = s
	}
	for _, n := range names {
		if _, ok := m.snaps.byName[n]; !ok {
			m.log.Info("removing unrecorded snapshot", "snapshot", n)
			if err := snapshot.Remove(m.snapshotDir(n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// thaw resumes the instance of sandbox id, which the store records as
// running, after a restart.
func (m *Manager) thaw(ctx context.Context, drv driver.Driver, id string) error {
	p, ok := drv.(driver.Pauser)
	if !ok {
		return fmt.Errorf("sandbox %s is paused and runtime %s cannot resume it", id, drv.Name())
	}
	m.log.Info("resuming sandbox frozen by an interrupted operation", "sandbox_id", id)
	if err := p.Resume(ctx, id); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return nil
}
