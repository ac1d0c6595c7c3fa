// Package overlay is the fallback storage backend for hosts without btrfs:
// a template is a plain directory tree, sealed read-only by a read-only
// bind mount of itself, and a sandbox root is an overlayfs mount with the
// template as its lower layer. It cannot limit a root's disk use.
//
// Layout under the state directory:
//
//	templates/<name>           template tree (a read-only bind mount of itself)
//	templates/.tmp-<name>-<x>  template being filled; removed at startup
//	templates/.deleted-<ino>   deleted template that roots still use as lower layer
//	roots/<id>/upper           the root's writes
//	roots/<id>/work            overlayfs work dir
//	roots/<id>/merged          the overlay mount: the root's path
//	roots/<id>/lower           inode number of the template tree in use
//	volumes/<name>             a volume: a plain directory, which the
//	                           backend cannot limit in size
//
// Overlayfs forbids changing a lower layer under a mounted overlay, so
// DeleteTemplate only renames a template that roots still use, and its
// tree is removed when the last such root is deleted. The overlay mount
// and this bookkeeping are shared with the btrfs backend (package ovl).
//
// The package does not know about sandboxes, drivers or the store.
package overlay

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
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/storage/internal/ovl"
	"github.com/corralrun/corral/internal/undo"
)

// Config configures New.
type Config struct {
	// Dir is the storage state directory, e.g. <state>/storage; created if
	// missing. Its filesystem must be usable as an overlayfs upper layer
	// (ext4, xfs, btrfs, tmpfs; not overlayfs itself). It may not contain
	// ',', ':' or '\', which overlayfs mount options reserve.
	Dir string
	// Logger receives a few lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// Backend implements storage.Backend with overlayfs. It is safe for
// concurrent use for distinct template names and root IDs.
type Backend struct {
	log    *slog.Logger
	dir    string
	layers *ovl.Layers
	// DirVolumes keeps volumes as plain directories under volumes/: no
	// size limit, and a copy that shares extents only where the
	// file system has reflinks (storage.Volumes).
	fsutil.DirVolumes
}

var (
	_ storage.Backend = (*Backend)(nil)
	_ storage.Changes = (*Backend)(nil)
	_ storage.Volumes = (*Backend)(nil)
)

// New opens the overlay storage under cfg.Dir. It removes templates that a
// crash left unfinished, seals every template again (bind mounts do not
// survive a reboot), and removes deleted templates that no root uses
// anymore. It costs a directory scan plus one bind mount per template not
// yet sealed.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Dir == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "overlay storage needs a directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolving storage dir %s: %w", cfg.Dir, err)
	}
	if err := ovl.CheckDir(dir); err != nil {
		return nil, err
	}
	b := &Backend{log: cfg.Logger, dir: dir, DirVolumes: fsutil.DirVolumes{Dir: filepath.Join(dir, "volumes")}}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	b.layers = ovl.New(ovl.Config{
		Templates:  b.templatesDir(),
		Roots:      b.rootsDir(),
		TreeID:     inode,
		RemoveTree: func(ctx context.Context, path string) error { return removeTree(ctx, path, path) },
		Logger:     b.log,
	})
	for _, d := range []string{b.templatesDir(), b.rootsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	entries, err := os.ReadDir(b.templatesDir())
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	for _, e := range entries {
		path := filepath.Join(b.templatesDir(), e.Name())
		switch {
		case strings.HasPrefix(e.Name(), fsutil.TempPrefix):
			if err := removeTree(ctx, path, path); err != nil {
				return nil, fmt.Errorf("removing unfinished template: %w", err)
			}
			b.log.Info("removed unfinished template", "path", path)
		case !strings.HasPrefix(e.Name(), "."):
			if err := seal(path); err != nil {
				return nil, fmt.Errorf("sealing template %s: %w", e.Name(), err)
			}
		}
	}
	if err := b.RemoveTemp(); err != nil {
		return nil, fmt.Errorf("removing unfinished volume copies: %w", err)
	}
	if err := b.layers.Collect(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// Close unmounts the templates' read-only bind mounts. Roots stay mounted
// and keep working (their overlays hold the template trees themselves);
// delete them first to leave no mounts behind. The next New seals the
// templates again. Close is idempotent.
func (b *Backend) Close() error {
	entries, err := os.ReadDir(b.templatesDir())
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := fsutil.Unmount(context.Background(), filepath.Join(b.templatesDir(), e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Name returns "overlay".
func (b *Backend) Name() string { return "overlay" }

func (b *Backend) templatesDir() string { return filepath.Join(b.dir, "templates") }
func (b *Backend) rootsDir() string     { return filepath.Join(b.dir, "roots") }

// TemplatePath returns the path of template name's read-only tree.
func (b *Backend) TemplatePath(name string) string {
	return filepath.Join(b.templatesDir(), name)
}

// RootPath returns the path of root id's overlay mount (roots/<id>/merged).
func (b *Backend) RootPath(id string) string {
	return filepath.Join(b.rootsDir(), id, "merged")
}

// ChangesPath is the upper directory of root id (storage.Changes).
func (b *Backend) ChangesPath(id string) string {
	return filepath.Join(b.rootsDir(), id, "upper")
}

// CreateTemplate fills a directory under a temporary name, renames it to
// name and seals it with a read-only bind mount; on any failure it removes
// the tree. The cost is fill's plus about a millisecond. Names follow
// fsutil.CheckName (errors wrap errdefs.ErrInvalidArgument).
func (b *Backend) CreateTemplate(ctx context.Context, name string, fill func(dir string) error) (err error) {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	final := b.TemplatePath(name)
	if _, err := os.Lstat(final); err == nil {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %s already exists", name)
	}
	tmp := filepath.Join(b.templatesDir(), fsutil.TempName(name))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("creating dir for template %s: %w", name, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(context.Context) error {
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("removing half-made template %s: %w", tmp, err)
		}
		return nil
	})
	// The tree's root becomes the sandbox's "/": 0755 whatever our umask.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("creating dir for template %s: %w", name, err)
	}
	if err := fill(tmp); err != nil {
		return fmt.Errorf("filling template %s: %w", name, err)
	}
	return b.layers.Publish(ctx, tmp, name, seal)
}

// DeleteTemplate removes template name. If no root uses it, its tree is
// removed now; otherwise it is renamed out of sight and removed with the
// last root that uses it. Unknown names return an error wrapping
// errdefs.ErrNotFound.
func (b *Backend) DeleteTemplate(ctx context.Context, name string) error {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	return b.layers.DeleteTemplate(ctx, name, func(path string) error { return fsutil.Unmount(ctx, path) })
}

// Templates lists the complete templates, sorted. It reads one directory.
func (b *Backend) Templates(ctx context.Context) ([]string, error) {
	return b.layers.Templates()
}

// CreateRoot mounts an overlay with template as its lower layer at
// roots/<id>/merged: a few mkdirs and one mount. It refuses
// opts.DiskBytes > 0 with an error wrapping errdefs.ErrNotImplemented:
// overlayfs has no quota of its own, and the backend does not set up
// project quotas on the filesystem under it. Unknown templates return an error wrapping errdefs.ErrNotFound,
// an existing id one wrapping ErrAlreadyExists.
func (b *Backend) CreateRoot(ctx context.Context, id, template string, opts storage.RootOptions) (_ string, err error) {
	if opts.DiskBytes != 0 {
		return "", fmt.Errorf("creating root %s: %w", id,
			errdefs.Errorf(errdefs.ErrNotImplemented, "overlay backend cannot enforce a disk limit; use btrfs"))
	}
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	if err := fsutil.CheckName("template name", template); err != nil {
		return "", err
	}
	root := filepath.Join(b.rootsDir(), id)
	if err := os.Mkdir(root, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "root %s already exists", id)
		}
		return "", fmt.Errorf("creating root %s: %w", id, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return b.removeRoot(ctx, root) })
	merged := b.RootPath(id)
	if err := os.Mkdir(merged, 0o755); err != nil {
		return "", fmt.Errorf("creating root %s: %w", id, err)
	}
	if err := b.layers.Mount(id, template, merged, opts.IDMap); err != nil {
		return "", err
	}
	return merged, nil
}

// DeleteRoot unmounts root id (retrying for a second while busy, then
// detaching lazily) and removes its directory. Most of its cost is the
// sync of the upper filesystem that unmounting an overlay implies, plus a
// walk of everything the sandbox wrote. A root whose mount is already gone
// (host reboot, crash during create) is removed just the same; a missing
// root is not an error.
func (b *Backend) DeleteRoot(ctx context.Context, id string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	root := filepath.Join(b.rootsDir(), id)
	if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := b.removeRoot(ctx, root); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	return b.layers.Collect(ctx)
}

// Roots lists the roots, half-made ones included, sorted.
func (b *Backend) Roots(ctx context.Context) ([]string, error) {
	return fsutil.ListNames(b.rootsDir())
}

func (b *Backend) removeRoot(ctx context.Context, root string) error {
	return removeTree(ctx, root, filepath.Join(root, "merged"))
}

// seal makes the tree at path read-only by bind-mounting it onto itself
// and remounting the bind read-only. A path that is already a mount point
// is taken as sealed.
func seal(path string) error {
	mounted, err := fsutil.IsMountPoint(path)
	if err != nil || mounted {
		return err
	}
	if err := unix.Mount(path, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return errors.Join(fmt.Errorf("remounting %s read-only: %w", path, err), unix.Unmount(path, unix.MNT_DETACH))
	}
	return nil
}

// removeTree unmounts mountPoint (if mounted) and removes dir, which is
// mountPoint itself or contains it. It refuses to remove through a mount
// that is still there, which would delete files of the mounted layers.
func removeTree(ctx context.Context, dir, mountPoint string) error {
	if err := ovl.Unmount(ctx, mountPoint); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

func inode(path string) (string, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("no inode number for %s", path)
	}
	return strconv.FormatUint(sys.Ino, 10), nil
}
