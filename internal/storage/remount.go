package storage

import (
	"context"
	"os"
)

// RootMounter is a Backend whose roots are mounts that can be taken down
// while the root's files stay on disk, as a stopped sandbox's do, and that
// a host reboot takes down as well.
type RootMounter interface {
	// UnmountRoot unmounts root id and keeps its files; a root that is
	// not mounted is fine. The unmount syncs the root's writes.
	// DeleteRoot works on an unmounted root.
	UnmountRoot(ctx context.Context, id string) error
	// MountRoot mounts root id again over its files when its mount is
	// gone, and returns its host path; a root that is mounted is left as
	// it is. It costs a statx call when mounted, and a directory scan of
	// the templates plus the mount otherwise. A root that does not exist
	// returns an error wrapping errdefs.ErrNotFound. idmap is as
	// RootOptions.IDMap: the root's layers are shown through it.
	MountRoot(ctx context.Context, id string, idmap *os.File) (string, error)
}
