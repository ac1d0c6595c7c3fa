package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
)

// maxTargetLinks bounds the symlinks followed while resolving a target,
// as the kernel's limit does for a path.
const maxTargetLinks = 40

// resolveTarget resolves target, a clean absolute path, in the tree at
// rootfs the way the runtime does when it makes the mount point: every
// symlink is followed inside the root (an absolute link and ".." stop at
// its top), and components that do not exist are kept as named, since the
// runtime makes them as directories. It returns the resolved path and
// the first symlink it met ("" when none).
func resolveTarget(rootfs, target string) (resolved, link string, err error) {
	r, err := os.OpenRoot(rootfs)
	if err != nil {
		return "", "", err
	}
	defer r.Close()
	cur, rest := "/", strings.Split(strings.TrimPrefix(target, "/"), "/")
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		// cur holds no symlink, so only next's last name can be one.
		fi, err := r.Lstat(strings.TrimPrefix(next, "/"))
		if errors.Is(err, fs.ErrNotExist) {
			return path.Join(append([]string{next}, rest...)...), link, nil
		}
		if errors.Is(err, syscall.ENOTDIR) {
			return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: %s is not a directory in the sandbox's root", target, cur)
		}
		if err != nil {
			return "", "", fmt.Errorf("resolving mount target %s: %w", target, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxTargetLinks {
			return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: too many symlinks in its path in the template", target)
		}
		dest, err := r.Readlink(strings.TrimPrefix(next, "/"))
		if err != nil {
			return "", "", fmt.Errorf("resolving mount target %s: %w", target, err)
		}
		if link == "" {
			link = next
		}
		if path.IsAbs(dest) {
			cur = "/"
		}
		rest = append(strings.Split(dest, "/"), rest...)
	}
	return cur, link, nil
}

// resolveTargets resolves the targets of ms in the sandbox's root at
// rootfs and applies the target rules to what they resolve to: a
// template's symlink must not lead a mount onto a path the runtime owns
// or into another mount. It returns the resolved targets, in ms's order.
func resolveTargets(rootfs string, ms []Mount) ([]string, error) {
	out := make([]string, len(ms))
	resolved := make([]Mount, len(ms))
	for i, mt := range ms {
		t, link, err := resolveTarget(rootfs, mt.Target)
		if err != nil {
			return nil, err
		}
		if link != "" {
			if err := checkTarget(t); err != nil {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "mount target %s: %s is a symlink in the sandbox's root, and the target resolves to %s: %v", mt.Target, link, t, err)
			}
		}
		out[i] = t
		resolved[i] = Mount{Target: t}
	}
	if err := checkNesting(resolved); err != nil {
		return nil, err
	}
	return out, nil
}
