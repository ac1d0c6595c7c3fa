package btrfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/storage/internal/ovl"
	"github.com/corralrun/corral/internal/undo"
)

// CreateRoot renames a spare snapshot of the seed to roots/<id> (or, with
// no spare left, snapshots the seed there), makes the upper and work dirs
// in it and mounts the overlay of template at Dir/merged/<id>. With a
// spare it needs no transaction commit; without, it pays the snapshot's.
// With opts.DiskBytes > 0 it enables quotas on the filesystem the first time
// (which costs a rescan) and limits the exclusive bytes of roots/<id>, so
// that the sandbox's writes beyond the limit fail with EDQUOT. Extents
// that copy-up clones from the template are shared, not exclusive, so
// changing a template file counts only the changed bytes. The sandbox sees
// overlayfs, which rejects btrfs ioctls, so it cannot make subvolumes that
// would escape the limit. Unknown templates return an error wrapping
// errdefs.ErrNotFound, an existing id one wrapping ErrAlreadyExists.
func (b *Backend) CreateRoot(ctx context.Context, id, template string, opts storage.RootOptions) (_ string, err error) {
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	if err := fsutil.CheckName("template name", template); err != nil {
		return "", err
	}
	if opts.DiskBytes < 0 {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "negative disk limit %d for root %s", opts.DiskBytes, id)
	}
	// Checked again, under the layers' lock, when mounting; this only
	// spares a snapshot for a name that is plainly wrong.
	if _, err := os.Lstat(b.TemplatePath(template)); errors.Is(err, fs.ErrNotExist) {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", template)
	}
	if opts.DiskBytes > 0 {
		if err := b.ensureQuota(); err != nil {
			return "", fmt.Errorf("enabling disk quotas for %s: %w", id, err)
		}
		if err := b.limitedRootAllowed("root " + id); err != nil {
			return "", err
		}
	}
	took, err := b.takeSpare(id)
	if !took && err == nil {
		err = b.snapshotSeed(id)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "root %s already exists", id)
		}
		return "", fmt.Errorf("creating subvolume for root %s: %w", id, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return b.DeleteRoot(ctx, id) })
	if opts.DiskBytes > 0 {
		if err := limitRoot(filepath.Join(b.rootsDir(), id), uint64(opts.DiskBytes)); err != nil {
			return "", fmt.Errorf("limiting disk of %s to %d bytes: %w", id, opts.DiskBytes, err)
		}
	}
	merged := b.RootPath(id)
	if err := os.Mkdir(merged, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("creating root %s: %w", id, err)
	}
	if err := b.layers.Mount(id, template, merged, opts.IDMap); err != nil {
		return "", err
	}
	return merged, nil
}

// DeleteRoot unmounts root id (retrying for a second while busy, then
// detaching lazily), removes its mount point and deletes its subvolume,
// including any subvolumes nested in it (found by walking the tree, which
// only happens when the plain delete reports them). A root whose mount is
// already gone (host reboot, crash during create) is deleted just the
// same; a missing root is not an error. Unmounting an overlay syncs its
// upper filesystem, which on btrfs is a transaction commit; the kernel
// unlinks the subvolume at once and frees its extents in the background.
// Then DeleteRoot makes up the spare roots that creates took (a snapshot
// each); a failure there is
// logged, not returned, since the root is gone.
//
// When quotas are on, the root's qgroup goes too, but not at once: it is
// removed in the background once the kernel's cleaner has dropped the
// subvolume and its counts are back to zero (see quota.go), since removing
// a qgroup that still counts bytes corrupts full accounting.
func (b *Backend) DeleteRoot(ctx context.Context, id string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	merged := b.RootPath(id)
	if err := ovl.Unmount(ctx, merged); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	// No longer a mount point, so nothing below it is the root's: at most
	// strays written into the bare mount point.
	if err := os.RemoveAll(merged); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	_, statErr := os.Lstat(filepath.Join(b.rootsDir(), id))
	if err := b.deleteRootSubvol(b.rootsDir(), id); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	if err := b.layers.Collect(ctx); err != nil {
		return err
	}
	if statErr != nil {
		return nil // there was no root: nothing to replace
	}
	if err := b.fillSpares(ctx); err != nil {
		// The root is gone; the next CreateRoot snapshots the seed itself.
		b.log.Warn("cannot make spare roots", "err", err)
	}
	return nil
}

// deleteRootSubvol deletes the subvolume parent/name of a root or a spare
// and, when quotas are on, hands its qgroup to the quota watcher, which
// removes it once the kernel has given back every byte it counted
// (quota.go).
func (b *Backend) deleteRootSubvol(parent, name string) error {
	var qgroup uint64
	if b.quotasEnabled() {
		qgroup, _ = subvolIDAt(filepath.Join(parent, name))
	}
	if err := deleteSubvol(parent, name); err != nil {
		return err
	}
	if qgroup != 0 {
		b.dropQgroup(qgroup)
	}
	return nil
}

// Roots lists the roots, sorted. It reads one directory.
func (b *Backend) Roots(ctx context.Context) ([]string, error) {
	return fsutil.ListNames(b.rootsDir())
}

// RootPath returns the path of root id's overlay mount, Dir/merged/<id>.
func (b *Backend) RootPath(id string) string {
	return filepath.Join(b.mergedDir(), id)
}

// ChangesPath is the upper directory of root id, in its subvolume
// (storage.Changes).
func (b *Backend) ChangesPath(id string) string {
	return filepath.Join(b.rootsDir(), id, "upper")
}
