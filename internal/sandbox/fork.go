package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/tenancy"
)

// MaxForks bounds the copies one Fork makes.
const MaxForks = 16

// restoreSource is what a sandbox is made from besides its template: a
// snapshot directory (published or the temporary one of a fork).
type restoreSource struct {
	dir    string
	memory bool
}

// useSnapshot verifies snapshot name's checksums and returns its record
// and directory. The snapshot cannot be deleted until release; any number
// of restores may use it at once.
func (m *Manager) useSnapshot(ctx context.Context, name string) (Snapshot, string, func(), error) {
	m.snaps.mu.Lock()
	s, ok := m.snaps.byName[name]
	ok = ok && tenancy.Sees(ctx, s.Tenant)
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
	if _, err := snapshotdir.Verify(dir); err != nil {
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
	if isReadySnapshot(spec.FromSnapshot) {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrNotFound, "snapshot %q not found", spec.FromSnapshot)
	}
	s, dir, release, err := m.useSnapshot(ctx, spec.FromSnapshot)
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
	// The quota counts the limits the snapshot gives.
	releaseQuota, err := m.reserveQuota(ctx, spec.limits(), 1)
	if err != nil {
		return Sandbox{}, err
	}
	defer releaseQuota()
	src := &restoreSource{dir: dir, memory: s.Kind == SnapshotMemory}
	if !s.VolumesCopied {
		spec.Mounts = s.Mounts
		return m.createSpec(ctx, spec, src, nil)
	}
	return m.createWithVolumeCopies(ctx, spec, s.Mounts, src)
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

// applyFiles replays the source's saved files, whose owners are stored
// IDs, on root, which shows them shifted by shift.
func (src *restoreSource) applyFiles(ctx context.Context, root string, shift snapshotdir.IDShift) error {
	f, err := os.Open(filepath.Join(src.dir, snapshotdir.ChangesName))
	if err != nil {
		return err
	}
	defer f.Close()
	return snapshotdir.ApplyShifted(ctx, f, root, shift)
}

// Fork makes n copies of a running or paused sandbox. On runtimes that
// checkpoint memory each copy continues the source's processes from the
// moment of the fork; elsewhere each copy starts fresh processes on a copy
// of the source's files (SnapshotKind says which). The source is frozen
// only while its state is saved. The copies get the source's template,
// limits, environment, metadata and network policy, and the default
// timeout. Either all n copies are made or none is left. A source with
// volumes is refused; ForkWith says what the copies get of them.
func (m *Manager) Fork(ctx context.Context, id string, n int) ([]Sandbox, error) {
	return m.ForkWith(ctx, id, n, ForkOptions{})
}

// ForkWith is Fork of a sandbox whose mounts may be volumes, which the
// copies share or get copies of, as o says (forkvolumes.go). Host
// directory mounts are refused either way.
func (m *Manager) ForkWith(ctx context.Context, id string, n int, o ForkOptions) ([]Sandbox, error) {
	if err := RangeForkCount.Check(int64(n)); err != nil {
		return nil, err
	}
	e, err := m.entry(ctx, id)
	if err != nil {
		return nil, err
	}
	sb, err := m.current(e, id)
	if err != nil {
		return nil, err
	}
	if err := checkVolumeChoice(sb, o.Volumes, "fork"); err != nil {
		return nil, err
	}
	release, err := m.reserveQuota(ctx, Limits{MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes, Pids: sb.Pids, DiskBytes: sb.DiskBytes}, n)
	if err != nil {
		return nil, err
	}
	defer release()
	kind := m.SnapshotKind(sb.Runtime)
	if kind == "" {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "forks are not available for runtime %s with %s storage", sb.Runtime, m.cfg.Storage.Name())
	}
	tmp, err := snapshotdir.TempDir(m.cfg.SnapshotDir, "fork-"+id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := os.RemoveAll(tmp); err != nil {
			m.log.Error("removing fork image", "sandbox_id", id, "err", err)
		}
	}()
	start := time.Now()
	spec := Spec{
		Template: sb.Template, Runtime: sb.Runtime, MilliCPUs: sb.MilliCPUs, MemoryBytes: sb.MemoryBytes,
		Pids: sb.Pids, DiskBytes: sb.DiskBytes, Env: sb.Env, Metadata: sb.Metadata, Network: sb.Network, Mounts: sb.Mounts,
	}
	sbs, drv, err := m.admitForks(ctx, spec, n)
	if err != nil {
		return nil, err
	}
	var copies []string
	var frozen func(context.Context) error
	if o.Volumes == VolumesCopy && len(sb.Mounts) > 0 {
		frozen = func(ctx context.Context) (err error) { copies, err = m.copyForkVolumes(ctx, sbs); return err }
	}
	if sb, err = m.capture(ctx, e, id, tmp, kind == SnapshotMemory, frozen); err != nil {
		return nil, errors.Join(err, m.dropVolumes(ctx, copies))
	}
	captured := time.Now()
	src := &restoreSource{dir: tmp, memory: kind == SnapshotMemory}
	out := make([]Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = m.create(ctx, sbs[i], drv, src, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		defer func() {
			if derr := m.dropVolumes(ctx, copies); derr != nil {
				m.log.Error("rolling back fork's volume copies", "sandbox_id", id, "err", derr)
			}
		}()
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
	s, dir, release, err := m.useSnapshot(ctx, snapName)
	if err != nil {
		return Template{}, err
	}
	defer release()
	base := m.cfg.Storage.TemplatePath(s.Template)
	src := &restoreSource{dir: dir}
	return m.CreateTemplate(ctx, name, "snapshot:"+snapName, func(tree string) error {
		if err := snapshotdir.CopyTree(ctx, base, tree); err != nil {
			return fmt.Errorf("copying template %s: %w", s.Template, err)
		}
		return src.applyFiles(ctx, tree, snapshotdir.IDShift{})
	})
}
