package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
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

// Snapshot is the record of one snapshot. It outlives its source sandbox
// and carries what a sandbox made from it needs.
type Snapshot struct {
	Name string `json:"name"`
	// Tenant owns the snapshot, as Sandbox.Tenant.
	Tenant string `json:"tenant,omitempty"`
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
	// Mounts are the volume mounts of the source, which sandboxes made
	// from the snapshot get: the source's own volumes (SnapshotSpec
	// Volumes share), or with VolumesCopied the snapshot's copies of
	// them, of which each such sandbox gets a copy in turn.
	Mounts        []Mount `json:"mounts,omitempty"`
	VolumesCopied bool    `json:"volumes_copied,omitempty"`
}

func (s Snapshot) clone() Snapshot {
	s.Env = cloneMap(s.Env)
	s.Metadata = cloneMap(s.Metadata)
	s.Mounts = append([]Mount(nil), s.Mounts...)
	if len(s.Mounts) == 0 {
		s.Mounts = nil
	}
	return s
}

// SnapshotSpec is what a caller asks for when snapshotting a sandbox.
type SnapshotSpec struct {
	// Name names the snapshot; the rules of template names apply.
	Name     string
	Metadata map[string]string
	// Volumes is VolumesShare or VolumesCopy, as for a fork: what the
	// snapshot keeps of the source's volumes. VolumesCopy takes a copy
	// of each, <volume>-<snapshot name>, while the source is frozen;
	// the snapshot's delete removes them.
	Volumes string
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
	if drv.Capabilities().PrivateDisk {
		return "" // storage cannot see the instance's writes
	}
	return SnapshotFilesystem
}

func (m *Manager) snapshotStore() SnapshotStore {
	s, _ := m.cfg.Store.(SnapshotStore)
	return s
}

func (m *Manager) snapshotDir(name string) string { return filepath.Join(m.cfg.SnapshotDir, name) }

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
	return m.snapshot(ctx, id, spec)
}

// snapshot is Snapshot under a name already checked, which may be a ready
// snapshot's (ready.go).
func (m *Manager) snapshot(ctx context.Context, id string, spec SnapshotSpec) (_ Snapshot, err error) {
	e, err := m.entry(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	sb, err := m.current(e, id)
	if err != nil {
		return Snapshot{}, err
	}
	if err := checkVolumeChoice(sb, spec.Volumes, "snapshot"); err != nil {
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
	tmp, err := snapshotdir.TempDir(m.cfg.SnapshotDir, spec.Name)
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
	vols := m.snapshotVolumes(sb, spec)
	defer vols.dropOnError(ctx, &err)
	if sb, err = m.capture(ctx, e, id, tmp, kind == SnapshotMemory, vols.frozen); err != nil {
		return Snapshot{}, err
	}
	captured := time.Now()
	snap := Snapshot{
		Name: spec.Name, Kind: kind, SandboxID: id, Template: sb.Template, Runtime: sb.Runtime,
		MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes,
		Env: cloneMap(sb.Env), Metadata: cloneMap(spec.Metadata), CreatedAt: m.cfg.Now().UTC(), Tenant: tenancy.Owner(ctx),
		Mounts: vols.mounts, VolumesCopied: vols.copied,
	}
	manifest, err := snapshotdir.Seal(tmp, snap)
	if err != nil {
		return Snapshot{}, err
	}
	for _, f := range manifest.Files {
		snap.SizeBytes += f.Size
	}
	final := m.snapshotDir(spec.Name)
	if err := snapshotdir.Publish(tmp, final); err != nil {
		return Snapshot{}, err
	}
	published = true
	if err := m.snapshotStore().PutSnapshot(ctx, snap); err != nil {
		if rerr := snapshotdir.Remove(final); rerr != nil {
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
// sandbox id into dir while the sandbox is frozen, then calls frozen (when
// set) before it thaws, and returns its record.
func (m *Manager) capture(ctx context.Context, e *entry, id, dir string, memory bool, frozen func(context.Context) error) (_ Sandbox, err error) {
	sb, unlock, err := m.lock(e, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	if sb.State == StateStopped {
		return Sandbox{}, notRunning(id, sb.State)
	}
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
		// gVisor cannot checkpoint a sandbox a second time while it
		// stays paused; after a resume it can again.
		if e.savedPaused {
			return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s was snapshotted or forked since it was paused; the runtime can save its memory once per pause: resume it first", id)
		}
		e.savedPaused = true
	}
	if memory {
		img := filepath.Join(dir, snapshotdir.MemoryDir)
		if err := os.Mkdir(img, 0o700); err != nil {
			return Sandbox{}, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
		}
		if err := m.drivers[sb.Runtime].(driver.Checkpointer).Checkpoint(ctx, id, img, true); err != nil {
			return Sandbox{}, err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, snapshotdir.ChangesName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Sandbox{}, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	err = snapshotdir.WriteChanges(ctx, f, m.cfg.Storage.(storage.Changes).ChangesPath(id))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("saving files of sandbox %s: %w", id, err)
	}
	if frozen != nil {
		if err := frozen(ctx); err != nil {
			return Sandbox{}, err
		}
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

// Snapshots lists the published snapshots by name, without the ready
// snapshots of templates, which belong to their template.
func (m *Manager) Snapshots(ctx context.Context) []Snapshot {
	m.snaps.mu.Lock()
	out := make([]Snapshot, 0, len(m.snaps.byName))
	for _, s := range m.snaps.byName {
		if !isReadySnapshot(s.Name) && tenancy.Sees(ctx, s.Tenant) {
			out = append(out, s.clone())
		}
	}
	m.snaps.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// GetSnapshot returns one snapshot.
func (m *Manager) GetSnapshot(ctx context.Context, name string) (Snapshot, error) {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	s, ok := m.snaps.byName[name]
	if !ok || isReadySnapshot(name) || !tenancy.Sees(ctx, s.Tenant) {
		return Snapshot{}, errdefs.Errorf(errdefs.ErrNotFound, "snapshot %q not found", name)
	}
	return s.clone(), nil
}

// DeleteSnapshot forgets a snapshot and removes its files. Sandboxes made
// from it are not affected. A template's ready snapshot is not found here:
// DropReady removes it.
func (m *Manager) DeleteSnapshot(ctx context.Context, name string) error {
	if _, err := m.GetSnapshot(ctx, name); err != nil {
		return err
	}
	return m.deleteSnapshot(ctx, name)
}

func (m *Manager) deleteSnapshot(ctx context.Context, name string) error {
	m.snaps.mu.Lock()
	s, ok := m.snaps.byName[name]
	if !ok {
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
	if err := snapshotdir.Remove(m.snapshotDir(name)); err != nil {
		return err
	}
	if s.VolumesCopied {
		return m.dropVolumes(ctx, mountedVolumes(s.Mounts))
	}
	return nil
}

// snapshotUsers lists the snapshots made on template name, but for the
// template's own ready snapshots.
func (m *Manager) snapshotUsers(template string) map[string]string {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	out := map[string]string{}
	for n, s := range m.snaps.byName {
		if s.Template == template && !isReadySnapshot(n) {
			out[n] = s.Tenant
		}
	}
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
	names, err := snapshotdir.Clean(m.cfg.SnapshotDir)
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
			if err := snapshotdir.Remove(m.snapshotDir(n)); err != nil {
				return err
			}
		}
	}
	return nil
}
