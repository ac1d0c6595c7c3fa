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
	"github.com/corralrun/corral/internal/undo"
)

var _ storage.Volumes = (*Backend)(nil)

// A volume is a subvolume of its own, volumes/<name>, so that its size
// limit is a qgroup limit on it (the one roots get, with the same quota
// watcher behind it) and its copy is a snapshot. Sandboxes see it through
// a bind mount, not an overlay, so the seccomp profile's refusal of the
// subvolume ioctls is what keeps them from making subvolumes in it that
// would escape the limit.

func (b *Backend) volumesDir() string { return filepath.Join(b.base, "volumes") }

// VolumePath returns volumes/<name> in the btrfs tree.
func (b *Backend) VolumePath(name string) string { return filepath.Join(b.volumesDir(), name) }

// CreateVolume creates volumes/<name> as an empty subvolume. With
// opts.SizeBytes it enables quotas the first time, as a limited root does,
// and limits the subvolume's exclusive bytes, so writes past the size fail
// with EDQUOT; while the accounting is inconsistent such a volume is
// refused with errdefs.ErrUnavailable. It costs a transaction commit.
func (b *Backend) CreateVolume(ctx context.Context, name string, opts storage.VolumeOptions) (_ string, err error) {
	if err := fsutil.CheckName("volume name", name); err != nil {
		return "", err
	}
	if opts.SizeBytes < 0 {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "negative size %d for volume %s", opts.SizeBytes, name)
	}
	if opts.SizeBytes > 0 {
		if err := b.ensureQuota(); err != nil {
			return "", fmt.Errorf("enabling disk quotas for volume %s: %w", name, err)
		}
		if err := b.limitedRootAllowed("volume " + name); err != nil {
			return "", err
		}
	}
	dirFd, err := b.openVolumesDir()
	if err != nil {
		return "", err
	}
	defer unix.Close(dirFd)
	if err := subvolCreate(dirFd, name); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", name)
		}
		return "", fmt.Errorf("creating subvolume for volume %s: %w", name, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return b.DeleteVolume(ctx, name) })
	path := b.VolumePath(name)
	if err := os.Chmod(path, 0o755); err != nil {
		return "", err
	}
	if err := os.Lchown(path, int(opts.UID), int(opts.GID)); err != nil {
		return "", fmt.Errorf("creating volume %s: %w", name, err)
	}
	if opts.SizeBytes > 0 {
		if err := limitRoot(path, uint64(opts.SizeBytes)); err != nil {
			return "", fmt.Errorf("limiting volume %s to %d bytes: %w", name, opts.SizeBytes, err)
		}
	}
	return path, nil
}

// CopyVolume snapshots volumes/<src> as volumes/<dst>, writable, and gives
// the snapshot src's limit. The snapshot shares every extent with src;
// under simple quotas only what is written into it afterwards counts
// against its limit.
func (b *Backend) CopyVolume(ctx context.Context, src, dst string) (_ string, err error) {
	for _, n := range []string{src, dst} {
		if err := fsutil.CheckName("volume name", n); err != nil {
			return "", err
		}
	}
	srcFd, err := unix.Open(b.VolumePath(src), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", src)
	}
	if err != nil {
		return "", fmt.Errorf("opening volume %s: %w", src, err)
	}
	defer unix.Close(srcFd)
	var limit uint64
	if b.quotasEnabled() {
		if id, err := subvolID(srcFd); err == nil {
			limit, _ = b.qgroupValue(id, "max_exclusive")
		}
	}
	dirFd, err := b.openVolumesDir()
	if err != nil {
		return "", err
	}
	defer unix.Close(dirFd)
	if err := snapshot(srcFd, dirFd, dst, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", dst)
		}
		return "", fmt.Errorf("snapshotting volume %s as %s: %w", src, dst, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return b.DeleteVolume(ctx, dst) })
	if limit > 0 {
		if err := limitRoot(b.VolumePath(dst), limit); err != nil {
			return "", fmt.Errorf("limiting volume %s to %d bytes: %w", dst, limit, err)
		}
	}
	return b.VolumePath(dst), nil
}

// DeleteVolume deletes volumes/<name> with any subvolume nested in it, and
// hands its qgroup to the quota watcher like a deleted root's.
func (b *Backend) DeleteVolume(_ context.Context, name string) error {
	if err := fsutil.CheckName("volume name", name); err != nil {
		return err
	}
	if err := b.deleteRootSubvol(b.volumesDir(), name); err != nil {
		return fmt.Errorf("deleting volume %s: %w", name, err)
	}
	return nil
}

// Volumes lists volumes/, sorted.
func (b *Backend) Volumes(context.Context) ([]string, error) {
	return fsutil.ListNames(b.volumesDir())
}

// VolumeUsage reads the exclusive bytes of a volume's qgroup while quotas
// are on, and walks its tree otherwise.
func (b *Backend) VolumeUsage(_ context.Context, name string) (int64, error) {
	if err := fsutil.CheckName("volume name", name); err != nil {
		return 0, err
	}
	path := b.VolumePath(name)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return 0, errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", name)
	}
	if b.quotasEnabled() {
		if id, err := subvolIDAt(path); err == nil {
			if n, ok := b.qgroupValue(id, "exclusive"); ok {
				return int64(n), nil
			}
		}
	}
	return fsutil.DiskUsage(path)
}

func (b *Backend) openVolumesDir() (int, error) {
	if err := os.MkdirAll(b.volumesDir(), 0o700); err != nil {
		return -1, fmt.Errorf("creating %s: %w", b.volumesDir(), err)
	}
	return openDir(b.volumesDir())
}
