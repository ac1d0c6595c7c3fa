package ocirt

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// PrepareSearchableDir creates dir with mode 0711 and checks that every
// directory above it is searchable by others: runtimes that work from
// inside a sandbox's user namespace (runc's init, gVisor's gofer) reach
// the mounts below it as an unprivileged host user.
func PrepareSearchableDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "mount dir %q is not an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("creating mount dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("creating mount dir: %w", err)
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("checking mount dir: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument,
				"mount dir %s: %s is not searchable by other users (mode %v), which sandbox roots in user namespaces need", dir, p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

// Bind bind-mounts src (with the mounts below it) at dst, which must
// exist.
func Bind(src, dst string) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("cloning mount of %s: %w", src, err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", src, dst, err)
	}
	return nil
}
