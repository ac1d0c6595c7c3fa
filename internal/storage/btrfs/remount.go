package btrfs

import (
	"context"
	"os"

	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/ovl"
)

var _ storage.RootMounter = (*Backend)(nil)

// MountRoot implements storage.RootMounter: after a reboot a root's
// subvolume is in roots/<id> while its overlay mount is gone.
func (b *Backend) MountRoot(_ context.Context, id string, idmap *os.File) (string, error) {
	return b.layers.Remount(id, b.RootPath(id), idmap)
}

// UnmountRoot implements storage.RootMounter.
func (b *Backend) UnmountRoot(ctx context.Context, id string) error {
	return ovl.UnmountRoot(ctx, id, b.RootPath(id))
}
