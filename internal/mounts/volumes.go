package mounts

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// A volume's mount (sandbox.Mount.Volume) has as Source the host path the
// daemon's storage keeps the volume at. The operator's allowed roots do
// not apply to it, since the daemon made it; it is still opened without
// following a symlink anywhere in its path, and cloned like a host
// directory. Its files keep the stored ID range on disk, which the
// mount maps to the range of the sandbox's root.

// openVolume opens the volume at path as an O_PATH descriptor, refusing a
// path with a symlink or "..".
func openVolume(path string) (int, error) {
	if filepath.Clean(path) != path || !filepath.IsAbs(path) {
		return -1, errdefs.Errorf(errdefs.ErrInvalidArgument, "volume path %q: want a clean absolute path", path)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ENOENT):
		return -1, errdefs.Errorf(errdefs.ErrNotFound, "volume %s: its directory is gone", path)
	default:
		return -1, fmt.Errorf("opening volume %s: %w", path, err)
	}
}

// volumeIDMap returns the namespace that maps the stored ID range
// (driver.StoredIDBase, driver.StoredIDSize IDs) to the range that starts
// at the sandbox's root IDs, or -1 when the two start at the same IDs.
// The owner of the volume's top directory plays no part: every file in a
// volume is in the stored range.
func (m *Mounter) volumeIDMap(root driver.HostIDs) (int, error) {
	stored := driver.HostIDs{UID: driver.StoredIDBase, GID: driver.StoredIDBase}
	return m.ids.getRange(stored, root, driver.StoredIDSize)
}
