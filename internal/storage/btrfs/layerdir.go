package btrfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

var _ storage.LayerDirs = (*Backend)(nil)

// LayerDir implements storage.LayerDirs: roots/<id>/layers, beside the
// overlay's upper and work directories in the root's subvolume, so that
// the root's qgroup limit counts what is written there.
func (b *Backend) LayerDir(id string) (string, error) {
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	sub := filepath.Join(b.rootsDir(), id)
	if _, err := os.Lstat(sub); errors.Is(err, fs.ErrNotExist) {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "root %s not found", id)
	}
	dir := filepath.Join(sub, "layers")
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("making the layer directory of root %s: %w", id, err)
	}
	return dir, nil
}
