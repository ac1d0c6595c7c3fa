package mounts

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/undo"
)

var _ sandbox.Mounter = (*Mounter)(nil)

// Config configures a Mounter.
type Config struct {
	// Allowed are the host directories beneath which sources may be
	// mounted; none allows nothing.
	Allowed []string
	// RunDir holds the prepared mounts, StateDir the copy-on-write
	// layers; both are made if missing and must be private to the daemon.
	RunDir, StateDir string
	Logger           *slog.Logger
}

// Mounter prepares and releases sandboxes' mounts. It is safe for
// concurrent use.
type Mounter struct {
	cfg     Config
	allowed []string
	log     *slog.Logger
	ids     *idmaps
	mu      sync.Mutex // serialises Prepare, Release and Sweep of one daemon
}

// New checks cfg and returns a Mounter. Allowed roots must be absolute
// directories; a symlink among them is resolved once, here, by the
// operator's authority.
func New(cfg Config) (*Mounter, error) {
	if cfg.RunDir == "" || cfg.StateDir == "" {
		return nil, errors.New("mounts: RunDir and StateDir are required")
	}
	var allowed []string
	for _, a := range cfg.Allowed {
		if !filepath.IsAbs(a) {
			return nil, fmt.Errorf("allowed mount root %q: not an absolute path", a)
		}
		r, err := filepath.EvalSymlinks(a)
		if err != nil {
			return nil, fmt.Errorf("allowed mount root %s: %w", a, err)
		}
		fi, err := os.Stat(r)
		if err != nil {
			return nil, fmt.Errorf("allowed mount root %s: %w", a, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("allowed mount root %s: not a directory", a)
		}
		allowed = append(allowed, filepath.Clean(r))
	}
	for _, d := range []*string{&cfg.RunDir, &cfg.StateDir} {
		if err := os.MkdirAll(*d, 0o700); err != nil {
			return nil, err
		}
		// Resolved, so that a path here names what the kernel mounted.
		r, err := filepath.EvalSymlinks(*d)
		if err != nil {
			return nil, err
		}
		*d = r
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ids, err := newIDMaps()
	if err != nil {
		log.Info("ID mappings for mounts are made by re-executing this binary", "reason", err)
	}
	return &Mounter{cfg: cfg, allowed: allowed, log: log, ids: ids}, nil
}

// Close releases the ID-mapping namespaces the Mounter holds; prepared
// mounts stay, for the sandboxes still using them.
func (m *Mounter) Close() error {
	m.mu.Lock() // a Prepare in flight may be using a namespace
	defer m.mu.Unlock()
	return m.ids.close()
}

// Check implements sandbox.Mounter.
func (m *Mounter) Check(ms []sandbox.Mount) error {
	for _, mt := range ms {
		fd, err := m.open(mt.Source)
		if err != nil {
			return err
		}
		if mt.Mode == sandbox.MountReadWrite {
			var st unix.Stat_t
			if err = unix.Fstat(fd, &st); err == nil {
				err = refuseRootOwned(st, mt.Source)
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// open opens source, a directory beneath an allowed root, as an O_PATH
// descriptor, refusing a source outside the roots (permission_denied) and
// a path with a symlink, "..", or no directory at its end
// (invalid_argument).
func (m *Mounter) open(source string) (int, error) {
	if filepath.Clean(source) != source || !filepath.IsAbs(source) {
		return -1, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount source %q: want a clean absolute path", source)
	}
	root, rel, ok := m.beneath(source)
	if !ok {
		return -1, m.outside(source)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening allowed mount root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP):
		return -1, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount source %s: its path has a symlink; name the directory itself", source)
	case errors.Is(err, unix.ENOENT):
		return -1, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount source %s: no such directory", source)
	case errors.Is(err, unix.ENOTDIR):
		return -1, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount source %s: not a directory", source)
	case errors.Is(err, unix.EXDEV):
		return -1, m.outside(source)
	default:
		return -1, fmt.Errorf("opening mount source %s: %w", source, err)
	}
}

// beneath returns the allowed root that holds source, longest first, and
// source relative to it.
func (m *Mounter) beneath(source string) (root, rel string, ok bool) {
	for _, a := range m.allowed {
		if (source == a || strings.HasPrefix(source, a+"/") || a == "/") && len(a) > len(root) {
			root = a
		}
	}
	if root == "" {
		return "", "", false
	}
	rel, err := filepath.Rel(root, source)
	return root, rel, err == nil
}

func (m *Mounter) outside(source string) error {
	if len(m.allowed) == 0 {
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "mount source %s: this server allows no mounts (corral server --allow-mount DIR)", source)
	}
	return errdefs.Errorf(errdefs.ErrPermissionDenied, "mount source %s: not beneath an allowed root (%s)", source, strings.Join(m.allowed, ", "))
}

// Prepare implements sandbox.Mounter.
func (m *Mounter) Prepare(ctx context.Context, id string, ms []sandbox.Mount, o sandbox.MountOptions) (_ []driver.Mount, err error) {
	if !driver.ValidID(id) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sandbox id %q not usable for mounts", id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var u undo.Stack
	defer u.OnError(ctx, &err)
	dir := filepath.Join(m.cfg.RunDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("preparing mounts: %w", err)
	}
	// Layers that a Detach kept hold a stopped sandbox's changes: a
	// failed Prepare of its start leaves them for the next one.
	if _, err := os.Lstat(filepath.Join(m.cfg.StateDir, id)); err == nil {
		u.Add(func(context.Context) error { return m.detach(id) })
	} else {
		u.Add(func(context.Context) error { return m.release(id) })
	}
	out := make([]driver.Mount, 0, len(ms))
	for i, mt := range ms {
		src, err := m.prepare(id, filepath.Join(dir, strconv.Itoa(i)), i, mt, o)
		if err != nil {
			return nil, fmt.Errorf("mount %s: %w", mt.Target, err)
		}
		out = append(out, driver.Mount{Source: src, Target: mt.Target, ReadOnly: mt.Mode == sandbox.MountReadOnly})
	}
	return out, nil
}

// prepare makes mount mt of sandbox id in dir and returns the path to
// bind. What it makes lies under dir and the sandbox's state directory,
// where release looks for it.
func (m *Mounter) prepare(id, dir string, i int, mt sandbox.Mount, o sandbox.MountOptions) (string, error) {
	open := m.open
	if mt.Volume != "" {
		open = openVolume
	}
	fd, err := open(mt.Source)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	// Private: a mount the host makes beneath the source later must not
	// appear in the clone, where it would be neither read-only nor mapped.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if mt.Mode != sandbox.MountReadWrite {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	if mt.Mode == sandbox.MountReadWrite && mt.Volume == "" {
		if err := refuseRootOwned(st, mt.Source); err != nil {
			return "", err
		}
	}
	var ns int
	if mt.Volume != "" {
		ns, err = m.volumeIDMap(o.Root)
	} else {
		ns, err = m.ids.get(driver.HostIDs{UID: st.Uid, GID: st.Gid}, idPair{o.Root, o.User})
	}
	if err != nil {
		return "", err
	}
	if ns >= 0 {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	src := filepath.Join(dir, "src")
	// A read-only mount only shows owners; on a file system that cannot
	// be ID-mapped it still works, with the owner shown unmapped.
	if err := attach(fd, attr, src, mt.Mode == sandbox.MountReadOnly); err != nil {
		return "", err
	}
	if mt.Mode != sandbox.MountCopyOnWrite {
		return src, nil
	}
	return m.overlay(id, dir, i, src, o)
}

// refuseRootOwned refuses a rw mount of a directory that host root owns:
// the sandbox's root would create files owned by host root there,
// set-user-ID ones included, which host users could then run.
func refuseRootOwned(st unix.Stat_t, source string) error {
	if st.Uid == 0 || st.Gid == 0 {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "mount source %s is owned by root: a rw mount would let the sandbox make root's files on the host; mount it ro or cow, or give it an unprivileged owner", source)
	}
	return nil
}

// attach clones the tree at fd, applies attr to every mount in the clone,
// and attaches it at path, made as a directory. With unmapped, a clone
// that cannot be ID-mapped is attached without the mapping.
func attach(fd int, attr unix.MountAttr, path string, unmapped bool) error {
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("cloning the source: %w", err)
	}
	defer unix.Close(tree)
	err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	if errors.Is(err, unix.EINVAL) && attr.Attr_set&unix.MOUNT_ATTR_IDMAP != 0 && unmapped {
		attr.Attr_set &^= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = 0
		err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	}
	if err != nil {
		if errors.Is(err, unix.EINVAL) && attr.Attr_set&unix.MOUNT_ATTR_IDMAP != 0 {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "the source's file system cannot be ID-mapped (mount it ro, or from btrfs, ext4, xfs or tmpfs)")
		}
		return fmt.Errorf("setting mount attributes: %w", err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		return err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the source: %w", err)
	}
	return nil
}

// overlay mounts, at dir/cow, an overlay of the read-only clone lower with
// an upper layer of sandbox id's own, and returns its path. The layer
// lies in o.LayerDir (the sandbox root's accounting) when that is set,
// with a symlink to it where it lies otherwise, under the state
// directory. It is used through mappedLayer, so that its files keep
// stored IDs on disk whatever range the sandbox runs in.
func (m *Mounter) overlay(id, dir string, i int, lower string, o sandbox.MountOptions) (string, error) {
	layer, err := m.layerPath(id, i, o.LayerDir)
	if err != nil {
		return "", err
	}
	if layer, err = m.mappedLayer(layer, filepath.Join(dir, "layer"), o.Root); err != nil {
		return "", err
	}
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", err
		}
	}
	// The upper directory is the sandbox's view of the mount's root, so
	// it takes the lower one's owner and mode.
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		return "", err
	}
	if err := os.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return "", err
	}
	if err := os.Chmod(upper, fs.FileMode(st.Mode&0o7777)); err != nil {
		return "", err
	}
	target := filepath.Join(dir, "cow")
	if err := os.Mkdir(target, 0o700); err != nil {
		return "", err
	}
	// Without redirects and metadata-only copies, the upper layer holds
	// every change as itself, which Changes relies on.
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off"
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("mounting the copy-on-write layer: %w", err)
	}
	return target, nil
}

// layerPath makes the directory of the cow layer of mount i of sandbox id
// and returns its real path: <StateDir>/<id>/<i>, or layers/<i> linked
// from there. A layer kept from before (Detach) is found again: the link
// made then names the same place.
func (m *Mounter) layerPath(id string, i int, layers string) (string, error) {
	link := filepath.Join(m.cfg.StateDir, id, strconv.Itoa(i))
	if layers == "" {
		return link, os.MkdirAll(link, 0o700)
	}
	real := filepath.Join(layers, strconv.Itoa(i))
	if err := os.MkdirAll(real, 0o700); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		return "", err
	}
	err := os.Symlink(real, link)
	if errors.Is(err, fs.ErrExist) {
		// Kept by Detach, for a stopped sandbox started again.
		if to, rerr := os.Readlink(link); rerr == nil && to == real {
			return real, nil
		}
	}
	return real, err
}

// Release implements sandbox.Mounter.
func (m *Mounter) Release(_ context.Context, id string) error {
	if !driver.ValidID(id) {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.release(id)
}

// detach detaches the mounts Prepare made for sandbox id and removes
// their directories, keeping the copy-on-write layers. It unmounts the paths it knows it made, until none
// is mounted, and removes directories only with rmdir: a directory that is
// still a mount point, which would be the host directory itself, is never
// walked into (EBUSY instead of a recursive delete of the user's files).
func (m *Mounter) detach(id string) error {
	dir := filepath.Join(m.cfg.RunDir, id)
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var errs []error
	for _, e := range ents {
		n := filepath.Join(dir, e.Name())
		for _, p := range []string{filepath.Join(n, "cow"), filepath.Join(n, "src"), filepath.Join(n, "layer")} {
			if err := unmountAll(p); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if err := os.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeLayers removes the copy-on-write layers under state, the
// daemon's own files with no mount among them, also those that symlinks
// there lead to (layerPath made both).
func removeLayers(state string) error {
	ents, err := os.ReadDir(state)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		real, err := os.Readlink(filepath.Join(state, e.Name()))
		if err != nil {
			return err
		}
		if err := os.RemoveAll(real); err != nil {
			return err
		}
	}
	return os.RemoveAll(state)
}

// unmountAll detaches every mount stacked at p, without following a
// symlink there.
func unmountAll(p string) error {
	for range 16 {
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not a mount point (any more), or gone
		}
		if err != nil {
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	return fmt.Errorf("unmounting %s: still mounted", p)
}

// Sweep implements sandbox.Mounter.
func (m *Mounter) Sweep(_ context.Context, keep func(id string) bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, d := range []string{m.cfg.RunDir, m.cfg.StateDir} {
		ents, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range ents {
			seen[e.Name()] = true
		}
	}
	var errs []error
	for id := range seen {
		if driver.ValidID(id) && !keep(id) {
			m.log.Info("removing orphaned mounts", "sandbox_id", id)
			errs = append(errs, m.release(id))
		}
	}
	return errors.Join(errs...)
}
