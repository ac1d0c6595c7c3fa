package mounts

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// mappedLayer returns the path through which a cow mount's layer
// directory layer is used by a sandbox whose root runs as root: layer
// itself when root is the stored root, otherwise an ID-mapped clone of it
// attached at path, which shows the stored range as the range from root.
// A sandbox with a host ID range of its own gets another range each time
// it starts; through the clone what it writes lands in the stored range,
// so that its cow changes keep their owners from one start to the next,
// as its root's files do. Host root stays itself: overlayfs makes its
// work files and copies up with the mounter's credentials. A layer on a
// file system that cannot be ID-mapped is used as it is, with the owners
// of the range the sandbox ran in.
func (m *Mounter) mappedLayer(layer, path string, root driver.HostIDs) (string, error) {
	if (root.UID == driver.StoredIDBase && root.GID == driver.StoredIDBase) || root == (driver.HostIDs{}) {
		return layer, nil
	}
	ns, err := m.ids.namespace(layerMapping(root.UID), layerMapping(root.GID))
	if err != nil {
		return "", fmt.Errorf("making the ID mapping of the copy-on-write layer: %w", err)
	}
	fd, err := unix.Open(layer, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening the copy-on-write layer: %w", err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:    unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd:   uint64(ns),
		Propagation: unix.MS_PRIVATE,
	}
	if err := attach(fd, attr, path, false); err != nil {
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return "", fmt.Errorf("mapping the copy-on-write layer: %w", err)
		}
		m.log.Warn("the copy-on-write layer's file system cannot be ID-mapped; its files take the owners of the sandbox's current range", "layer", layer, "error", err)
		return layer, nil
	}
	return path, nil
}

// layerMapping is one ID map of mappedLayer: 0 as 0, and the stored range
// as the range from root.
func layerMapping(root uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{
		{ContainerID: 0, HostID: 0, Size: 1},
		{ContainerID: driver.StoredIDBase, HostID: int(root), Size: driver.StoredIDSize},
	}
}
