// Package ovl lays the overlayfs roots that both storage backends build:
// a template tree as the read-only lower layer, and per root an upper and
// a work directory. It also keeps a deleted template's tree for as long as
// roots still use it, because overlayfs forbids changing a lower layer
// under a mounted overlay.
//
// A backend supplies the directories and two operations on its template
// trees (how to name one, how to remove one); where a root's upper lives
// and where it is mounted stay the backend's business. Layout inside the
// directories this package is given:
//
//	<templates>/<name>          template tree, the lower layer
//	<templates>/.deleted-<tid>  deleted template that roots still use
//	<roots>/<id>/upper          the root's writes
//	<roots>/<id>/work           overlayfs work dir
//	<roots>/<id>/lower          tree ID (<tid>) of the template in use
//
// The package knows nothing about quotas, subvolumes or sandboxes.
package ovl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// DeletedPrefix starts the names of deleted templates that roots still use.
const DeletedPrefix = ".deleted-"

// options pin the overlayfs features whose defaults are kernel build and
// module parameters, so that a root behaves the same on every host:
//   - index=off, metacopy=off: no inode index and no metadata-only copy-up;
//     both add on-disk state that ties an upper to one exact lower and
//     that nothing here needs (with reflinks, btrfs copy-up is cheap
//     anyway).
//   - redirect_dir=off: renaming a directory that came from the template
//     fails with EXDEV, which mv and most libraries answer by copying; the
//     upper layer then stays a plain tree that a later snapshot or fork
//     can reuse without redirect xattrs.
//   - xino=off: with all layers on one filesystem overlayfs ignores xino
//     and reports the real inode numbers; see the btrfs backend for how it
//     keeps those unique across its subvolumes.
//
// Not volatile: it would spare the sync of the upper filesystem that
// every unmount does (on btrfs, a transaction commit), but it also turns
// the sandbox's fsync and syncfs into no-ops.
const options = "index=off,metacopy=off,redirect_dir=off,xino=off"

// CheckDir rejects a state directory that overlayfs mount options cannot
// name: ',' separates options, ':' separates lower layers and '\' escapes.
// Errors wrap errdefs.ErrInvalidArgument.
func CheckDir(dir string) error {
	if strings.ContainsAny(dir, `,:\`) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "storage dir %q contains one of , : \\ (overlayfs cannot name it)", dir)
	}
	return nil
}

// Config configures New.
type Config struct {
	// Templates is the directory of template trees, Roots that of the
	// roots' directories. Both exist.
	Templates, Roots string
	// TreeID names the template tree at path by a value that no other
	// tree in Templates has while this one exists, and that stays the
	// same when the tree is renamed (an inode number, a subvolume ID).
	TreeID func(path string) (string, error)
	// RemoveTree removes a deleted template's tree, which no root uses
	// anymore.
	RemoveTree func(ctx context.Context, path string) error
	// Logger receives a message per removed tree; nil discards them.
	Logger *slog.Logger
}

// Layers mounts roots over templates and publishes and deletes templates
// so that a tree is never renamed or removed while a root is being
// mounted on it. It is safe for concurrent use.
type Layers struct {
	cfg Config
	log *slog.Logger

	// mu orders template publication and removal (writers) against
	// Mount's use of a template (readers).
	mu sync.RWMutex
}

// New returns the Layers of cfg. It touches nothing on disk.
func New(cfg Config) *Layers {
	l := &Layers{cfg: cfg, log: cfg.Logger}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l
}

// Templates lists the published templates, sorted.
func (l *Layers) Templates() ([]string, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return fsutil.ListNames(l.cfg.Templates)
}

// Publish renames the finished tree tmp to <templates>/<name> and then
// calls sealed, if not nil, with the new path; no root can use the
// template before sealed returns. A name that exists returns an error
// wrapping errdefs.ErrAlreadyExists, and tmp is left to the caller.
// When sealed fails, the template is removed again (RemoveTree).
func (l *Layers) Publish(ctx context.Context, tmp, name string, sealed func(path string) error) error {
	final := filepath.Join(l.cfg.Templates, name)
	l.mu.Lock()
	defer l.mu.Unlock()
	// RENAME_NOREPLACE makes a concurrent CreateTemplate of the same name
	// lose cleanly instead of replacing the winner.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %s already exists", name)
		}
		return fmt.Errorf("publishing template %s: %w", name, err)
	}
	if sealed == nil {
		return nil
	}
	if err := sealed(final); err != nil {
		// No root can have used the template: we hold mu.
		return errors.Join(fmt.Errorf("sealing template %s: %w", name, err), l.cfg.RemoveTree(ctx, final))
	}
	return nil
}

// Mount makes <roots>/<id>/upper and work (the directory <roots>/<id>
// exists), records the tree of template in <roots>/<id>/lower and mounts
// the overlay at merged, an existing empty directory outside upper and
// work. With idmap (an open user namespace, see storage.RootOptions) the
// layers are ID-mapped with it (mountMapped). It costs a few mkdirs, a
// small write and the mount.
// Unknown templates return an error wrapping errdefs.ErrNotFound. On
// error the caller removes what Mount made along with <roots>/<id>.
func (l *Layers) Mount(id, template, merged string, idmap *os.File) error {
	dir := filepath.Join(l.cfg.Roots, id)
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("creating root %s: %w", id, err)
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	lower := filepath.Join(l.cfg.Templates, template)
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", template)
		}
		return fmt.Errorf("creating root %s: %w", id, err)
	}
	tid, err := l.cfg.TreeID(lower)
	if err != nil {
		return fmt.Errorf("creating root %s: %w", id, err)
	}
	// The overlay's root directory takes its owner and mode from the upper
	// dir, so give upper those of the template's root.
	if err := os.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("creating root %s: %w", id, err)
	}
	if err := unix.Chmod(upper, st.Mode&07777); err != nil {
		return fmt.Errorf("creating root %s: %w", id, err)
	}
	// Record the tree in use before mounting, so that a DeleteTemplate
	// after this point keeps the tree for us.
	if err := os.WriteFile(filepath.Join(dir, "lower"), []byte(tid+"\n"), 0o600); err != nil {
		return fmt.Errorf("creating root %s: %w", id, err)
	}
	if idmap != nil {
		if err := mountMapped(lower, dir, merged, idmap); err != nil {
			return fmt.Errorf("mounting overlay of %s for %s: %w", template, id, err)
		}
		return nil
	}
	opt := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", lower, upper, work, options)
	if err := unix.Mount("overlay", merged, "overlay", 0, opt); err != nil {
		return fmt.Errorf("mounting overlay of %s for %s: %w", template, id, err)
	}
	return nil
}

// Unmount unmounts the overlay at merged (retrying while busy, then
// detaching it lazily, as fsutil.Unmount does) and makes sure that merged
// is no mount point anymore, so that removing the root's files cannot go
// through a mount into the layers. A path that is not mounted is fine.
func Unmount(ctx context.Context, merged string) error {
	if err := fsutil.Unmount(ctx, merged); err != nil {
		return err
	}
	if mounted, err := fsutil.IsMountPoint(merged); err != nil || mounted {
		return errors.Join(err, fmt.Errorf("%s is still mounted", merged))
	}
	return nil
}

// DeleteTemplate removes template name from view: under the write lock it
// calls release (if not nil) with the template's path, renames the tree
// to <templates>/.deleted-<tid> and removes it at once unless a root uses
// it. Unknown names return an error wrapping errdefs.ErrNotFound.
func (l *Layers) DeleteTemplate(ctx context.Context, name string, release func(path string) error) error {
	path := filepath.Join(l.cfg.Templates, name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", name)
	}
	tid, err := l.cfg.TreeID(path)
	if err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	if release != nil {
		if err := release(path); err != nil {
			return fmt.Errorf("deleting template %s: %w", name, err)
		}
	}
	if err := os.Rename(path, filepath.Join(l.cfg.Templates, DeletedPrefix+tid)); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	return l.collectLocked(ctx)
}

// Collect removes the deleted templates that no root uses anymore. It
// costs one directory read when there are none; otherwise it reads every
// root's lower file, under the write lock. Call it after removing a root's
// lower file and when opening the storage.
func (l *Layers) Collect(ctx context.Context) error {
	if !l.hasDeleted() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.collectLocked(ctx)
}

func (l *Layers) hasDeleted() bool {
	entries, _ := os.ReadDir(l.cfg.Templates)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), DeletedPrefix) {
			return true
		}
	}
	return false
}

// collectLocked is Collect with mu held for writing.
func (l *Layers) collectLocked(ctx context.Context) error {
	entries, err := os.ReadDir(l.cfg.Templates)
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var deleted []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), DeletedPrefix) {
			deleted = append(deleted, e.Name())
		}
	}
	if len(deleted) == 0 {
		return nil
	}
	inUse := map[string]bool{}
	roots, err := os.ReadDir(l.cfg.Roots)
	if err != nil {
		return fmt.Errorf("listing roots: %w", err)
	}
	for _, r := range roots {
		tid, err := os.ReadFile(filepath.Join(l.cfg.Roots, r.Name(), "lower"))
		if err == nil {
			inUse[strings.TrimSpace(string(tid))] = true
		}
	}
	for _, name := range deleted {
		if inUse[strings.TrimPrefix(name, DeletedPrefix)] {
			continue
		}
		path := filepath.Join(l.cfg.Templates, name)
		if err := l.cfg.RemoveTree(ctx, path); err != nil {
			return fmt.Errorf("removing deleted template %s: %w", path, err)
		}
		l.log.Debug("removed deleted template", "path", path)
	}
	return nil
}
