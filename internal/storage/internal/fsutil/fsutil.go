// Package fsutil holds the small filesystem helpers that the storage
// backends share: name validation, temporary names, mount point checks and
// unmounting. It knows nothing about templates or roots.
package fsutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// TempPrefix starts the names of trees that are still being built. Such
// names are never valid template names, so listings skip them and startup
// removes them.
const TempPrefix = ".tmp-"

// maxNameLen keeps TempName(name) within the 255-byte limit of a file name.
const maxNameLen = 128

// CheckName validates a template name or root ID: 1 to 128 characters of
// [A-Za-z0-9._-], starting with a letter or digit. The charset keeps names
// safe as single path elements and inside overlayfs mount options, where
// ',' ':' and '\' are separators or escapes. kind names the value in the
// error ("template name", "root id"). Errors wrap errdefs.ErrInvalidArgument.
func CheckName(kind, name string) error {
	if name == "" || len(name) > maxNameLen {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid %s %q: must be 1 to %d characters", kind, name, maxNameLen)
	}
	for i, c := range name {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum || i > 0 && (c == '.' || c == '_' || c == '-') {
			continue
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid %s %q: only letters, digits and . _ - are allowed, starting with a letter or digit", kind, name)
	}
	return nil
}

// TempName returns a fresh hidden name for building name in place:
// ".tmp-<name>-<8 hex digits>".
func TempName(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux.
	return TempPrefix + name + "-" + hex.EncodeToString(b[:])
}

// ListNames returns the sorted names in dir that do not start with a dot
// (dot names are temporary or internal). A missing dir lists as empty.
func ListNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// IsMountPoint reports whether path is the root of a mount, including a
// bind mount of a directory onto itself (which a device-number comparison
// cannot see). It costs one statx call. A missing path is not a mount point.
func IsMountPoint(path string) (bool, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, 0, &st)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking mount point %s: %w", path, err)
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, fmt.Errorf("checking mount point %s: kernel does not report STATX_ATTR_MOUNT_ROOT", path)
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// Unmount unmounts path and everything mounted on it again (stacked
// mounts), so that afterwards path is not a mount point. While the mount is
// busy it retries for about a second, then detaches it lazily (MNT_DETACH):
// the kernel finishes the unmount when the last user goes away. A path that
// is not mounted, or does not exist, is not an error.
func Unmount(ctx context.Context, path string) error {
	deadline := time.Now().Add(time.Second)
	delay := 5 * time.Millisecond
	for {
		err := unix.Unmount(path, 0)
		switch {
		case err == nil:
			continue // a mount may be stacked below the one just removed
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			err := unix.Unmount(path, unix.MNT_DETACH)
			if errors.Is(err, unix.EINVAL) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("detaching busy mount %s: %w", path, err)
			}
			continue
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}
