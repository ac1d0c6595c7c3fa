package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/undo"
)

// Volume is a named tree of files that belongs to no sandbox: sandboxes
// mount it (Mount.Volume), several at once, and it outlives them and the
// daemon until deleted.
type Volume struct {
	Name string `json:"name"`
	// Tenant owns the volume, as Sandbox.Tenant.
	Tenant string `json:"tenant,omitempty"`
	// SizeBytes limits the bytes written into the volume; 0 is no limit.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// UsedBytes is what the volume takes, as well as storage can tell
	// cheaply; it is not persisted.
	UsedBytes int64             `json:"used_bytes"`
	CreatedAt time.Time         `json:"created_at"`
	Labels    map[string]string `json:"labels,omitempty"`
	// InUseBy lists the sandboxes whose records mount the volume, by ID;
	// it is not persisted.
	InUseBy []string `json:"in_use_by,omitempty"`
}

func (v Volume) clone() Volume {
	v.Labels = cloneMap(v.Labels)
	v.InUseBy = append([]string(nil), v.InUseBy...)
	if len(v.InUseBy) == 0 {
		v.InUseBy = nil
	}
	return v
}

// VolumeOptions is what a caller asks for when creating a volume.
type VolumeOptions struct {
	// Name: 1 to 63 characters of [a-z0-9_.-], starting with a letter or
	// digit.
	Name      string
	SizeBytes int64
	Labels    map[string]string
}

// VolumeStore persists volume records. A Store that implements it, with
// a storage backend that implements storage.Volumes, enables volumes;
// Put and Delete must be durable when they return.
type VolumeStore interface {
	PutVolume(ctx context.Context, v Volume) error
	DeleteVolume(ctx context.Context, name string) error
	Volumes(ctx context.Context) ([]Volume, error)
}

// volumes is the Manager's view of the volumes. mu is held across each
// create and delete, and while a sandbox's volume mounts are resolved,
// so that a delete never removes a volume a sandbox is about to mount.
type volumes struct {
	mu     sync.Mutex
	byName map[string]Volume
}

var volumeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func checkVolumeName(name string) error {
	if !volumeName.MatchString(name) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "volume name %q: want 1 to 63 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit", name)
	}
	return nil
}

// volumeBackend returns the store and storage of volumes, or an error
// wrapping errdefs.ErrNotImplemented when either cannot keep them.
func (m *Manager) volumeBackend() (VolumeStore, storage.Volumes, error) {
	vs, ok := m.cfg.Store.(VolumeStore)
	sv, ok2 := m.cfg.Storage.(storage.Volumes)
	if !ok || !ok2 {
		return nil, nil, errdefs.Errorf(errdefs.ErrNotImplemented, "this server keeps no volumes")
	}
	return vs, sv, nil
}

// CreateVolume makes an empty volume, owned inside sandboxes by their
// root user. A size needs a storage backend that can limit one (btrfs);
// others refuse it with errdefs.ErrNotImplemented. An existing name is
// errdefs.ErrAlreadyExists. A failed create leaves nothing behind.
func (m *Manager) CreateVolume(ctx context.Context, o VolumeOptions) (_ Volume, err error) {
	if err := checkVolumeName(o.Name); err != nil {
		return Volume{}, err
	}
	if err := RangeVolumeSize.Check(o.SizeBytes); err != nil {
		return Volume{}, fmt.Errorf("volume %s: %w", o.Name, err)
	}
	for k := range o.Labels {
		if k == "" {
			return Volume{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "volume %s: a label needs a key", o.Name)
		}
	}
	vs, sv, err := m.volumeBackend()
	if err != nil {
		return Volume{}, err
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	if _, ok := m.vols.byName[o.Name]; ok {
		return Volume{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", o.Name)
	}
	v := Volume{Name: o.Name, Tenant: tenancy.Owner(ctx), SizeBytes: o.SizeBytes, CreatedAt: m.cfg.Now().UTC(), Labels: cloneMap(o.Labels)}
	if err := m.addVolume(ctx, vs, sv, v, func() error {
		_, err := sv.CreateVolume(ctx, v.Name, storage.VolumeOptions{SizeBytes: v.SizeBytes, UID: driver.StoredIDBase, GID: driver.StoredIDBase})
		return err
	}); err != nil {
		return Volume{}, err
	}
	m.log.Info("volume created", "volume", v.Name, "size_bytes", v.SizeBytes)
	return v.clone(), nil
}

// addVolume makes v's tree with mk and records v, under vols.mu; a
// failure removes the tree again.
func (m *Manager) addVolume(ctx context.Context, vs VolumeStore, sv storage.Volumes, v Volume, mk func() error) (err error) {
	if err := mk(); err != nil {
		return fmt.Errorf("creating volume %s: %w", v.Name, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return sv.DeleteVolume(ctx, v.Name) })
	if err := vs.PutVolume(ctx, v); err != nil {
		return fmt.Errorf("recording volume %s: %w", v.Name, err)
	}
	if m.vols.byName == nil {
		m.vols.byName = map[string]Volume{}
	}
	m.vols.byName[v.Name] = v
	return nil
}

// Volume returns one volume with its usage and users.
func (m *Manager) Volume(ctx context.Context, name string) (Volume, error) {
	m.vols.mu.Lock()
	v, ok := m.vols.byName[name]
	m.vols.mu.Unlock()
	if !ok || !tenancy.Sees(ctx, v.Tenant) {
		return Volume{}, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	return m.volumeView(ctx, v), nil
}

// Volumes lists the volumes by name, with their usage and users. It
// measures each volume (a walk of its tree where storage has no
// accounting).
func (m *Manager) Volumes(ctx context.Context) ([]Volume, error) {
	m.vols.mu.Lock()
	out := make([]Volume, 0, len(m.vols.byName))
	for _, v := range m.vols.byName {
		if tenancy.Sees(ctx, v.Tenant) {
			out = append(out, v)
		}
	}
	m.vols.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	for i, v := range out {
		out[i] = m.volumeView(ctx, v)
	}
	return out, nil
}

func (m *Manager) volumeView(ctx context.Context, v Volume) Volume {
	v = v.clone()
	v.InUseBy = m.volumeUsers(v.Name)
	if sv, ok := m.cfg.Storage.(storage.Volumes); ok {
		v.UsedBytes, _ = sv.VolumeUsage(ctx, v.Name) // best effort
	}
	return v
}

// volumeUsers lists the sandboxes, pool members included, whose records
// mount volume name.
func (m *Manager) volumeUsers(name string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var ids []string
	for id, e := range m.sandboxes {
		for _, mt := range e.sb.Mounts {
			if mt.Volume == name {
				ids = append(ids, id)
				break
			}
		}
	}
	sort.Strings(ids)
	return ids
}

// volumeSnapshots lists the snapshots whose sandboxes would mount volume
// name, or a copy of it.
func (m *Manager) volumeSnapshots(name string) []string {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	var out []string
	for n, s := range m.snaps.byName {
		for _, mt := range s.Mounts {
			if mt.Volume == name {
				out = append(out, n)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// DeleteVolume removes a volume and its files. A volume that a sandbox
// mounts, or that a snapshot keeps for the sandboxes made from it, is
// errdefs.ErrFailedPrecondition, naming them.
func (m *Manager) DeleteVolume(ctx context.Context, name string) error {
	vs, sv, err := m.volumeBackend()
	if err != nil {
		return err
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	if v, ok := m.vols.byName[name]; !ok || !tenancy.Sees(ctx, v.Tenant) {
		return errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	if users := m.volumeUsers(name); len(users) > 0 {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is mounted by sandbox %s: delete them first", name, strings.Join(users, ", "))
	}
	if snaps := m.volumeSnapshots(name); len(snaps) > 0 {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is kept by snapshot %s: delete them first", name, strings.Join(snaps, ", "))
	}
	// Files first: a failure there keeps the record, so the delete can be
	// retried; a record without files is dropped at the next start.
	if err := sv.DeleteVolume(ctx, name); err != nil {
		return err
	}
	if err := vs.DeleteVolume(ctx, name); err != nil {
		return fmt.Errorf("forgetting volume %s: %w", name, err)
	}
	delete(m.vols.byName, name)
	m.log.Info("volume deleted", "volume", name)
	return nil
}

// reconcileVolumes loads the volume records and makes storage agree:
// a record whose tree is gone is dropped, and a tree without a record
// (what a crash in a create left) is removed.
func (m *Manager) reconcileVolumes(ctx context.Context) error {
	vs, sv, err := m.volumeBackend()
	if err != nil {
		return nil // volumes are unavailable; there is nothing to load
	}
	recs, err := vs.Volumes(ctx)
	if err != nil {
		return fmt.Errorf("loading volumes: %w", err)
	}
	names, err := sv.Volumes(ctx)
	if err != nil {
		return fmt.Errorf("listing volumes in storage: %w", err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	m.vols.byName = map[string]Volume{}
	for _, v := range recs {
		if !have[v.Name] {
			m.log.Warn("dropping record of volume whose files are gone", "volume", v.Name)
			if err := vs.DeleteVolume(ctx, v.Name); err != nil {
				return fmt.Errorf("forgetting volume %s: %w", v.Name, err)
			}
			continue
		}
		delete(have, v.Name)
		m.vols.byName[v.Name] = v
	}
	for n := range have {
		m.log.Info("removing volume without a record", "volume", n)
		if err := sv.DeleteVolume(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// resolveVolumes returns ms with each volume mount's Source set to the
// volume's host path, refusing a volume that does not exist
// (errdefs.ErrNotFound). Called once the sandbox's entry is in, so a
// delete that runs after it sees the sandbox as a user.
func (m *Manager) resolveVolumes(ctx context.Context, ms []Mount) ([]Mount, error) {
	out := make([]Mount, len(ms))
	copy(out, ms)
	var sv storage.Volumes
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	for i, mt := range out {
		if mt.Volume == "" {
			continue
		}
		if v, ok := m.vols.byName[mt.Volume]; !ok || !tenancy.Sees(ctx, v.Tenant) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "mount %s: volume %q not found (corral volume create %s)", mt.Target, mt.Volume, mt.Volume)
		}
		if sv == nil {
			sv = m.cfg.Storage.(storage.Volumes) // a recorded volume implies it
		}
		out[i].Source = sv.VolumePath(mt.Volume)
	}
	return out, nil
}

// volumeMounts reports whether ms has a volume mount, and whether all of
// its mounts are volumes.
func volumeMounts(ms []Mount) (some, all bool) {
	all = len(ms) > 0
	for _, mt := range ms {
		if mt.Volume != "" {
			some = true
		} else {
			all = false
		}
	}
	return some, all
}

// hostMounts returns the mounts of ms that are host directories.
func hostMounts(ms []Mount) []Mount {
	var out []Mount
	for _, mt := range ms {
		if mt.Volume == "" {
			out = append(out, mt)
		}
	}
	return out
}

// copyVolume makes volume dst a copy of src, with src's size limit and
// labels; storage makes it copy-on-write where it can (a btrfs
// snapshot). src should not be written meanwhile.
func (m *Manager) copyVolume(ctx context.Context, src, dst string) (Volume, error) {
	if err := checkVolumeName(dst); err != nil {
		return Volume{}, err
	}
	vs, sv, err := m.volumeBackend()
	if err != nil {
		return Volume{}, err
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	orig, ok := m.vols.byName[src]
	if !ok {
		return Volume{}, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", src)
	}
	if _, ok := m.vols.byName[dst]; ok {
		return Volume{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", dst)
	}
	v := Volume{Name: dst, Tenant: orig.Tenant, SizeBytes: orig.SizeBytes, CreatedAt: m.cfg.Now().UTC(), Labels: cloneMap(orig.Labels)}
	if err := m.addVolume(ctx, vs, sv, v, func() error {
		_, err := sv.CopyVolume(ctx, src, dst)
		return err
	}); err != nil {
		return Volume{}, err
	}
	m.log.Info("volume copied", "volume", dst, "from", src)
	return v.clone(), nil
}
