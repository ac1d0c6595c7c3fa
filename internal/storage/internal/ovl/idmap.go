package ovl

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// mountMapped mounts at merged the overlay of the template tree lower and
// of dir's upper and work directories, each layer an ID-mapped clone made
// with the user namespace idmap: overlayfs refuses to be ID-mapped itself,
// but takes ID-mapped layers, and does every access to a layer through
// the layer's mapping. So the files keep their stored owners on disk and
// the overlay shows them as idmap maps them, and what the sandbox writes
// lands on disk with the stored owner again.
//
// The layers are handed to overlayfs as descriptors (fsconfig(2) with
// FSCONFIG_SET_FD), so the clones are never attached anywhere: each goes
// once the overlay holds its own reference. upperdir and workdir come from
// one clone of dir because overlayfs wants them on the same mount.
//
// The mapping must also map ID 0 to 0: overlayfs makes its work
// directory and copy-up files with the mounter's credentials (host root)
// before it gives them their owners, and a write through an ID-mapped
// mount under an ID the mapping lacks fails with EOVERFLOW. Cost: two
// clones, the fsconfig calls and the mount, and dropping the clones
// (an unmount of each, whose time varies with the host's load; see
// docs/BENCHMARKS.md).
func mountMapped(lower, dir, merged string, idmap *os.File) error {
	lo, err := mappedClone(lower, idmap)
	if err != nil {
		return fmt.Errorf("mapping the template: %w", err)
	}
	defer unix.Close(lo)
	layers, err := mappedClone(dir, idmap)
	if err != nil {
		return fmt.Errorf("mapping the upper layer: %w", err)
	}
	defer unix.Close(layers)
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetFd(fsfd, "lowerdir+", lo); err != nil {
		return fmt.Errorf("fsconfig lowerdir+: %w", err)
	}
	for _, name := range []string{"upperdir", "workdir"} {
		fd, err := unix.Openat(layers, strings.TrimSuffix(name, "dir"), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening %s: %w", name, err)
		}
		err = unix.FsconfigSetFd(fsfd, name, fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("fsconfig %s: %w", name, err)
		}
	}
	for _, kv := range strings.Split(options, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if err := unix.FsconfigSetString(fsfd, k, v); err != nil {
			return fmt.Errorf("fsconfig %s: %w", kv, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mnt)
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the overlay: %w", err)
	}
	return nil
}

// mappedClone returns a detached clone of the mount of path, rooted at
// path and ID-mapped with the user namespace idmap.
func mappedClone(path string, idmap *os.File) (int, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(idmap.Fd())}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("mount_setattr MOUNT_ATTR_IDMAP: %w", err)
	}
	return tree, nil
}
