package fsutil

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

// DiskUsage sums the allocated bytes of the files under dir, each hard
// link once, without following symlinks. It walks the whole tree.
func DiskUsage(dir string) (int64, error) {
	var n int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walk
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || seen[st.Ino] {
			return nil
		}
		if st.Nlink > 1 {
			seen[st.Ino] = true
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measuring %s: %w", dir, err)
	}
	return n, nil
}

// MakeVolumeDir makes dir, mode 0755 whatever the umask, owned by
// uid:gid.
func MakeVolumeDir(dir string, uid, gid uint32) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", filepath.Base(dir))
		}
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return os.Lchown(dir, int(uid), int(gid))
}

// CopyTree copies the tree src to dst, which must not exist, keeping
// owners, modes, times, extended attributes and hard links, and sharing
// extents (reflinks) where the file system can. It runs cp(1), whose
// --reflink=auto falls back to a plain copy.
func CopyTree(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copying %s: %w: %s", src, err, out)
	}
	return nil
}

// DirVolumes keeps volumes as plain directories, Dir/<name>, for backends
// without subvolumes: no size limit (refused with
// errdefs.ErrNotImplemented), and a copy that shares extents only where
// the file system has reflinks. Safe for concurrent use for distinct
// names.
type DirVolumes struct{ Dir string }

var _ storage.Volumes = DirVolumes{}

// VolumePath returns Dir/<name>.
func (v DirVolumes) VolumePath(name string) string { return filepath.Join(v.Dir, name) }

// CreateVolume makes Dir/<name>; it refuses a size limit.
func (v DirVolumes) CreateVolume(_ context.Context, name string, opts storage.VolumeOptions) (string, error) {
	if err := CheckName("volume name", name); err != nil {
		return "", err
	}
	if opts.SizeBytes != 0 {
		return "", errdefs.Errorf(errdefs.ErrNotImplemented, "volume %s: this storage backend cannot limit a volume's size (btrfs can)", name)
	}
	if err := os.MkdirAll(v.Dir, 0o700); err != nil {
		return "", err
	}
	path := v.VolumePath(name)
	if err := MakeVolumeDir(path, opts.UID, opts.GID); err != nil {
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			_ = os.RemoveAll(path)
		}
		return "", fmt.Errorf("creating volume %s: %w", name, err)
	}
	return path, nil
}

// CopyVolume copies Dir/<src> under a temporary name and renames it to
// Dir/<dst>; a failed copy removes what it wrote.
func (v DirVolumes) CopyVolume(ctx context.Context, src, dst string) (string, error) {
	for _, n := range []string{src, dst} {
		if err := CheckName("volume name", n); err != nil {
			return "", err
		}
	}
	if fi, err := os.Lstat(v.VolumePath(src)); err != nil || !fi.IsDir() {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", src)
	}
	final := v.VolumePath(dst)
	if _, err := os.Lstat(final); err == nil {
		return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", dst)
	}
	tmp := filepath.Join(v.Dir, TempName(dst))
	if err := CopyTree(ctx, v.VolumePath(src), tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	// RENAME_NOREPLACE: a volume made under dst meanwhile is kept.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		_ = os.RemoveAll(tmp)
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %s already exists", dst)
		}
		return "", fmt.Errorf("copying volume %s to %s: %w", src, dst, err)
	}
	return final, nil
}

// DeleteVolume removes Dir/<name>.
func (v DirVolumes) DeleteVolume(_ context.Context, name string) error {
	if err := CheckName("volume name", name); err != nil {
		return err
	}
	if err := os.RemoveAll(v.VolumePath(name)); err != nil {
		return fmt.Errorf("deleting volume %s: %w", name, err)
	}
	return nil
}

// Volumes lists Dir, sorted.
func (v DirVolumes) Volumes(context.Context) ([]string, error) { return ListNames(v.Dir) }

// VolumeUsage walks the volume's tree.
func (v DirVolumes) VolumeUsage(_ context.Context, name string) (int64, error) {
	if err := CheckName("volume name", name); err != nil {
		return 0, err
	}
	if _, err := os.Lstat(v.VolumePath(name)); errors.Is(err, fs.ErrNotExist) {
		return 0, errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", name)
	}
	return DiskUsage(v.VolumePath(name))
}

// RemoveTemp removes the copies a crash left half made.
func (v DirVolumes) RemoveTemp() error {
	ents, err := os.ReadDir(v.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if len(e.Name()) > len(TempPrefix) && e.Name()[:len(TempPrefix)] == TempPrefix {
			if err := os.RemoveAll(filepath.Join(v.Dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
