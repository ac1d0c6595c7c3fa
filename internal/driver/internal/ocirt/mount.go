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

// LockedOptions returns the mount options (mount(8) names) that keep the
// flags of the mount holding src which a user namespace cannot clear:
// the kernel refuses a remount inside one that would drop a read-only,
// noexec or access-time flag of a mount it received from outside, so a
// runtime that remounts a bind with options of its own must repeat them.
// nosuid and nodev are left out: every bind of a host directory sets
// them anyway.
func LockedOptions(src string) ([]string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(src, &st); err != nil {
		return nil, fmt.Errorf("reading the mount flags of %s: %w", src, err)
	}
	var out []string
	if st.Flags&unix.ST_RDONLY != 0 {
		out = append(out, "ro")
	}
	if st.Flags&unix.ST_NOEXEC != 0 {
		out = append(out, "noexec")
	}
	// A remount without an access-time option means relatime.
	switch {
	case st.Flags&unix.ST_NOATIME != 0:
		out = append(out, "noatime")
	case st.Flags&unix.ST_RELATIME == 0:
		out = append(out, "strictatime")
	}
	if st.Flags&unix.ST_NODIRATIME != 0 {
		out = append(out, "nodiratime")
	}
	return out, nil
}
