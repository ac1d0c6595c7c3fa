package sandbox

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/undo"
)

// MountMode is what a sandbox may do to a host directory it mounts.
type MountMode string

const (
	// MountReadOnly shows the directory read-only, recursively, with
	// set-user-ID bits and device files disabled.
	MountReadOnly MountMode = "ro"
	// MountReadWrite lets the sandbox's writes reach the directory; files
	// keep the directory owner's IDs on the host.
	MountReadWrite MountMode = "rw"
	// MountCopyOnWrite shows the directory writable, but every change lands
	// in a layer of the sandbox's own: the host directory is never changed.
	MountCopyOnWrite MountMode = "cow"
)

// MaxMounts bounds the mounts of one sandbox.
const MaxMounts = 32

// Mount is one host directory or volume a sandbox sees: exactly one of
// Source and Volume is set in a spec and a record.
type Mount struct {
	// Source is an absolute host path beneath a root the operator allows
	// (Mounter.Check). For a volume the Manager sets it to the volume's
	// host path when it hands the mount to the Mounter, never in a record.
	Source string `json:"source,omitempty"`
	// Volume names a volume (volumes.go), which the operator's roots do
	// not limit: the daemon made it.
	Volume string `json:"volume,omitempty"`
	// Target is the absolute path in the sandbox.
	Target string `json:"target"`
	// Mode is MountReadWrite when empty, as with Docker's -v.
	Mode MountMode `json:"mode"`
}

// Mounter makes the host side of sandboxes' mounts (package mounts). Its
// methods are safe for concurrent use.
type Mounter interface {
	// Check reports whether every source of ms may be mounted, without
	// changing anything: permission_denied for a source outside the
	// allowed roots, invalid_argument for one that is not a directory or
	// whose path has a symlink or "..".
	Check(ms []Mount) error
	// Prepare makes sandbox id's mounts ready to bind, in the order of ms
	// (see MountOptions). On failure it leaves nothing of them behind.
	Prepare(ctx context.Context, id string, ms []Mount, o MountOptions) ([]driver.Mount, error)
	// Release removes what Prepare made for sandbox id; it is not an
	// error when there is nothing.
	Release(ctx context.Context, id string) error
	// Sweep releases the mounts of every sandbox for which keep is false,
	// what a daemon that died in a create or delete left.
	Sweep(ctx context.Context, keep func(id string) bool) error
}

// MountOptions say what a Mounter needs to know of the sandbox whose
// mounts it prepares.
type MountOptions struct {
	// Root and User are the host IDs that the sandbox's root user and its
	// default user (the one an exec runs as) run as: a directory's owner
	// shows inside as User, and User's writes keep the owner's IDs on the
	// host.
	Root, User driver.HostIDs
	// LayerDir, when not empty, holds the layers of cow mounts, inside the
	// sandbox root's disk accounting (storage.LayerDirs); otherwise the
	// Mounter keeps them where no disk limit counts them.
	LayerDir string
}

// forbiddenTargets are the sandbox paths no mount may cover: the kernel's
// file systems and the agent's own files, which the runtime mounts, and
// the network files, which a mount over their directory would hide.
var forbiddenTargets = []string{"/proc", "/sys", "/dev", "/.corral"}

// networkFiles are bind-mounted over the root by the runtime; a mount of
// one of their parents would receive their mount points.
var networkFiles = []string{"/etc/resolv.conf", "/etc/hosts"}

// checkMounts validates ms's targets and modes and returns them with
// defaults applied, shallower targets first. No target may lie inside
// another.
func checkMounts(ms []Mount) ([]Mount, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	if len(ms) > MaxMounts {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%d mounts: at most %d", len(ms), MaxMounts)
	}
	out := make([]Mount, len(ms))
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		if m.Mode == "" {
			m.Mode = MountReadWrite
		}
		switch m.Mode {
		case MountReadOnly, MountReadWrite, MountCopyOnWrite:
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount %s: mode %q: want ro, rw or cow", m.Target, m.Mode)
		}
		switch {
		case m.Volume != "" && m.Source != "":
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount %s: names both a source and a volume; want one", m.Target)
		case m.Volume != "":
			if err := checkVolumeName(m.Volume); err != nil {
				return nil, err
			}
		case !path.IsAbs(m.Source):
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount source %q: not an absolute path", m.Source)
		}
		if err := checkTarget(m.Target); err != nil {
			return nil, err
		}
		if seen[m.Target] {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: named twice", m.Target)
		}
		seen[m.Target] = true
		out[i] = m
	}
	sort.SliceStable(out, func(i, j int) bool { return depth(out[i].Target) < depth(out[j].Target) })
	if err := checkNesting(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkNesting refuses two targets of which one lies inside the other, or
// the same target twice.
func checkNesting(ms []Mount) error {
	for i, a := range ms {
		for _, b := range ms[i+1:] {
			inner, outer := b.Target, a.Target
			if depth(inner) < depth(outer) {
				inner, outer = outer, inner
			}
			if inner == outer {
				return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: named twice", inner)
			}
			if strings.HasPrefix(inner, outer+"/") {
				// The runtime would make the inner mount point in the
				// outer host directory: a write to the host, or a failure
				// when that is read-only.
				return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s lies inside mount %s: mount one directory that holds both", inner, outer)
			}
		}
	}
	return nil
}

// checkTarget refuses a target that is not a clean absolute path, is the
// root, or covers a path the runtime or the agent owns.
func checkTarget(t string) error {
	if !path.IsAbs(t) || path.Clean(t) != t {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %q: want a clean absolute path", t)
	}
	if t == "/" {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target /: a mount cannot replace the root")
	}
	for _, f := range forbiddenTargets {
		if t == f || strings.HasPrefix(t, f+"/") {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: %s belongs to the runtime", t, f)
		}
	}
	for _, f := range networkFiles {
		if t == f || strings.HasPrefix(f, t+"/") {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: it would cover %s, which the network setup owns", t, f)
		}
	}
	return nil
}

func depth(p string) int { return strings.Count(p, "/") }

// admitMounts checks spec's mounts against the target rules, host
// directories against the operator's policy and volumes against those
// that exist; a Manager without a Mounter allows none.
func (m *Manager) admitMounts(ms []Mount) ([]Mount, error) {
	ms, err := checkMounts(ms)
	if err != nil || len(ms) == 0 {
		return ms, err
	}
	if m.cfg.Mounter == nil {
		return nil, errdefs.Errorf(errdefs.ErrPermissionDenied, "this server mounts no host directories (corral server --allow-mount DIR allows some)")
	}
	// Existence only: hostMounts checks that the caller may use them.
	if _, err := m.resolveVolumes(context.Background(), ms); err != nil {
		return nil, err
	}
	if hm := hostMounts(ms); len(hm) > 0 {
		if err := m.cfg.Mounter.Check(hm); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// prepareMounts makes the mounts of sandbox sb, whose root is rootfs on
// drv, and registers their release on u once they exist.
func (m *Manager) prepareMounts(ctx context.Context, u *undo.Stack, drv driver.Driver, sb Sandbox, rootfs string) ([]driver.Mount, error) {
	dm, err := m.hostMounts(ctx, drv, sb, rootfs)
	if err == nil && len(dm) > 0 {
		u.Add(func(ctx context.Context) error { return m.releaseMounts(ctx, sb) })
	}
	return dm, err
}

// hostMounts makes the mounts of sandbox sb, whose root is rootfs on drv;
// on failure nothing of them is left.
func (m *Manager) hostMounts(ctx context.Context, drv driver.Driver, sb Sandbox, rootfs string) ([]driver.Mount, error) {
	if len(sb.Mounts) == 0 {
		return nil, nil
	}
	if m.cfg.Mounter == nil { // a stopped sandbox started by a Manager without one
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has mounts and this server mounts nothing", sb.ID)
	}
	var root driver.HostIDs
	if ro, ok := drv.(driver.RootOwner); ok {
		var err error
		if root, err = ro.RootOwner(rootfs); err != nil {
			return nil, fmt.Errorf("preparing mounts of sandbox %s: %w", sb.ID, err)
		}
	}
	ms, err := m.resolveVolumes(ctx, sb.Mounts)
	if err != nil {
		return nil, err
	}
	user, err := m.mountUser(sb, rootfs, root)
	if err != nil {
		return nil, fmt.Errorf("preparing mounts of sandbox %s: %w", sb.ID, err)
	}
	targets, err := resolveTargets(rootfs, sb.Mounts)
	if err != nil {
		return nil, err
	}
	layers, err := m.layerDir(sb)
	if err != nil {
		return nil, fmt.Errorf("preparing mounts of sandbox %s: %w", sb.ID, err)
	}
	dm, err := m.cfg.Mounter.Prepare(ctx, sb.ID, ms, MountOptions{Root: root, User: user, LayerDir: layers})
	if err != nil {
		return nil, fmt.Errorf("preparing mounts of sandbox %s: %w", sb.ID, err)
	}
	for i := range dm {
		// The runtime resolves the path again in the same root, which no
		// process has changed since.
		dm[i].Target = targets[i]
	}
	return dm, nil
}

// layerDir returns where sandbox sb's cow layers go so that its disk limit
// counts them, or "" when it has no cow mount or storage cannot say.
func (m *Manager) layerDir(sb Sandbox) (string, error) {
	ld, ok := m.cfg.Storage.(storage.LayerDirs)
	if !ok || !slices.ContainsFunc(sb.Mounts, func(mt Mount) bool { return mt.Mode == MountCopyOnWrite }) {
		return "", nil
	}
	return ld.LayerDir(sb.ID)
}

// releaseMounts removes the host side of sandbox sb's mounts, once its
// instance is gone.
func (m *Manager) releaseMounts(ctx context.Context, sb Sandbox) error {
	if len(sb.Mounts) == 0 || m.cfg.Mounter == nil {
		return nil
	}
	if err := m.cfg.Mounter.Release(ctx, sb.ID); err != nil {
		return fmt.Errorf("releasing mounts of sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// refuseMounted refuses to snapshot or fork (what) a sandbox with mounts:
// a snapshot holds the root's changes only, so a copy would miss what the
// sandbox sees and changed through them.
func refuseMounted(sb Sandbox, what string) error {
	if len(sb.Mounts) == 0 {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has host directory mounts: cannot %s it", sb.ID, what)
}

// ChangeKind says how a path under a copy-on-write mount differs from the
// host directory.
type ChangeKind string

const (
	ChangeAdded    ChangeKind = "added"
	ChangeModified ChangeKind = "modified"
	ChangeDeleted  ChangeKind = "deleted"
)

// Change is one path a sandbox changed under a copy-on-write mount; Path
// is the path in the sandbox.
type Change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
}

// ChangeLister is implemented by Mounters that can list what a sandbox
// changed under its copy-on-write mounts.
type ChangeLister interface {
	// Changes lists the changes under mount i of sandbox id (an index into
	// its record's Mounts), by path.
	Changes(id string, i int, target string) ([]Change, error)
}

// MountChanges lists what sandbox id changed under its copy-on-write
// mount at target, compared with the host directory, which it never
// changes.
func (m *Manager) MountChanges(ctx context.Context, id, target string) ([]Change, error) {
	e, err := m.entry(ctx, id)
	if err != nil {
		return nil, err
	}
	sb, err := m.current(e, id)
	if err != nil {
		return nil, err
	}
	target = path.Clean(target)
	for i, mt := range sb.Mounts {
		if mt.Target != target {
			continue
		}
		if mt.Mode != MountCopyOnWrite {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "mount %s of sandbox %s is %s: only a cow mount keeps its changes apart", target, id, mt.Mode)
		}
		cl, ok := m.cfg.Mounter.(ChangeLister)
		if !ok {
			return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "this server cannot list a mount's changes")
		}
		return cl.Changes(id, i, target)
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s has no mount at %s", id, target)
}
