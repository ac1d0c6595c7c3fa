package fake

import (
	"context"
	"os"
	"path/filepath"

	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// Volumes are plain directories under volumes/, as with the overlay
// backend: no size limit. Run as an unprivileged user, a volume's top
// directory is that user's, since it cannot give it away.

func (b *Backend) vols() fsutil.DirVolumes {
	return fsutil.DirVolumes{Dir: filepath.Join(b.dir, "volumes")}
}

// CreateVolume makes volumes/<name>.
func (b *Backend) CreateVolume(ctx context.Context, name string, opts storage.VolumeOptions) (string, error) {
	if os.Geteuid() != 0 {
		opts.UID, opts.GID = uint32(os.Geteuid()), uint32(os.Getegid())
	}
	return b.vols().CreateVolume(ctx, name, opts)
}

// CopyVolume copies volumes/<src> to volumes/<dst>.
func (b *Backend) CopyVolume(ctx context.Context, src, dst string) (string, error) {
	return b.vols().CopyVolume(ctx, src, dst)
}

// DeleteVolume removes volumes/<name>.
func (b *Backend) DeleteVolume(ctx context.Context, name string) error {
	return b.vols().DeleteVolume(ctx, name)
}

// Volumes lists volumes/.
func (b *Backend) Volumes(ctx context.Context) ([]string, error) { return b.vols().Volumes(ctx) }

// VolumePath returns volumes/<name>.
func (b *Backend) VolumePath(name string) string { return b.vols().VolumePath(name) }

// VolumeUsage walks the volume.
func (b *Backend) VolumeUsage(ctx context.Context, name string) (int64, error) {
	return b.vols().VolumeUsage(ctx, name)
}
