package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// File access to a volume without a sandbox. Every path is absolute
// inside the volume ("/" is its top) and is opened through an os.Root on
// the volume's directory, so neither ".." nor a symlink a sandbox planted
// reaches outside it. What these calls create belongs to the stored root
// (the sandboxes' root user), and owners are reported as sandboxes see
// them: host ID minus driver.StoredIDBase.

// openVolume opens an os.Root on volume name's directory and returns p
// relative to it ("." for the top).
func (m *Manager) openVolume(ctx context.Context, name, p string) (*os.Root, string, error) {
	if !path.IsAbs(p) {
		return nil, "", errdefs.Errorf(errdefs.ErrInvalidArgument, "path %q: want an absolute path in the volume", p)
	}
	m.vols.mu.Lock()
	v, ok := m.vols.byName[name]
	m.vols.mu.Unlock()
	if !ok || !tenancy.Sees(ctx, v.Tenant) {
		return nil, "", errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	r, err := os.OpenRoot(m.cfg.Storage.(storage.Volumes).VolumePath(name))
	if err != nil {
		return nil, "", fmt.Errorf("opening volume %s: %w", name, err)
	}
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" {
		rel = "."
	}
	return r, rel, nil
}

// VolumeStat describes path in volume name without following a final
// symlink.
func (m *Manager) VolumeStat(ctx context.Context, name, p string) (wire.FileInfo, error) {
	r, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return wire.FileInfo{}, err
	}
	defer r.Close()
	return volumeInfo(r, rel, path.Clean(p))
}

// VolumeList describes the entries of directory path in volume name.
func (m *Manager) VolumeList(ctx context.Context, name, p string) ([]wire.FileInfo, error) {
	r, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	d, err := r.Open(rel)
	if err != nil {
		return nil, volumeError("listing "+p, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, volumeError("listing "+p, err)
	}
	out := make([]wire.FileInfo, 0, len(names))
	for _, n := range names {
		fi, err := volumeInfo(r, path.Join(rel, n), path.Join(path.Clean(p), n))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // removed while we list
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// VolumeReadFile opens regular file path in volume name and returns it
// with its size; the caller closes it.
func (m *Manager) VolumeReadFile(ctx context.Context, name, p string) (io.ReadCloser, int64, error) {
	r, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	f, err := r.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, volumeError("reading "+p, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errdefs.Errorf(errdefs.ErrFailedPrecondition, "reading %s: not a regular file", p)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// VolumeWriteFile writes r to path in volume name, making missing parent
// directories (mode 0755). A new file gets mode and the stored root as
// owner; an existing one keeps its owner and mode.
func (m *Manager) VolumeWriteFile(ctx context.Context, name, p string, r io.Reader, mode fs.FileMode) error {
	root, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if rel == "." {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "writing %s: the volume's top is a directory", p)
	}
	if err := mkdirs(root, path.Dir(rel), 0o755); err != nil {
		return volumeError("writing "+p, err)
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	created := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = root.OpenFile(rel, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0)
	}
	if err != nil {
		return volumeError("writing "+p, err)
	}
	if created {
		err = errors.Join(f.Chmod(mode), f.Chown(driver.StoredIDBase, driver.StoredIDBase))
	}
	if err == nil {
		_, err = io.Copy(f, r)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return volumeError("writing "+p, err)
	}
	return nil
}

// VolumeMkdir makes directory path in volume name (and, with parents,
// its missing parents, when path may also exist already), owned by the
// stored root.
func (m *Manager) VolumeMkdir(ctx context.Context, name, p string, parents bool, mode fs.FileMode) error {
	root, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if parents {
		err = mkdirs(root, rel, mode)
	} else {
		err = mkdir(root, rel, mode)
	}
	if err != nil {
		return volumeError("making directory "+p, err)
	}
	return nil
}

// VolumeRemove removes path in volume name and everything under it. The
// volume's top cannot be removed (DeleteVolume removes the volume).
func (m *Manager) VolumeRemove(ctx context.Context, name, p string) error {
	root, rel, err := m.openVolume(ctx, name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if rel == "." {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "removing %s: that is the volume itself (corral volume rm)", p)
	}
	if _, err := root.Lstat(rel); err != nil {
		return volumeError("removing "+p, err)
	}
	if err := root.RemoveAll(rel); err != nil {
		return volumeError("removing "+p, err)
	}
	return nil
}

// mkdir makes rel in root with mode, owned by the stored root.
func mkdir(root *os.Root, rel string, mode fs.FileMode) error {
	if err := root.Mkdir(rel, mode.Perm()); err != nil {
		return err
	}
	return errors.Join(root.Chmod(rel, mode.Perm()), root.Lchown(rel, driver.StoredIDBase, driver.StoredIDBase))
}

// mkdirs makes rel and its missing parents like mkdir; directories that
// exist are left as they are.
func mkdirs(root *os.Root, rel string, mode fs.FileMode) error {
	if rel == "." {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		cur = path.Join(cur, part)
		err := mkdir(root, cur, mode)
		if errors.Is(err, fs.ErrExist) {
			fi, serr := root.Stat(cur)
			if serr != nil {
				return serr
			}
			if !fi.IsDir() {
				return fmt.Errorf("%s: %w", cur, syscall.ENOTDIR)
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// volumeInfo describes rel in root, shown at volume path p, with owners
// as sandboxes see them.
func volumeInfo(root *os.Root, rel, p string) (wire.FileInfo, error) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return wire.FileInfo{}, volumeError("stat "+p, err)
	}
	info := wire.FileInfo{Name: path.Base(p), Path: p, Type: wire.FileTypeOther, Size: fi.Size(),
		Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime().UTC()}
	switch {
	case fi.Mode().IsRegular():
		info.Type = wire.FileTypeFile
	case fi.IsDir():
		info.Type = wire.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = wire.FileTypeSymlink
		info.Target, _ = root.Readlink(rel)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
		info.UID, info.GID = sandboxID(st.Uid), sandboxID(st.Gid)
	}
	if p == "/" {
		info.Name = "/"
	}
	return info, nil
}

// sandboxID is the in-sandbox ID of stored host ID id; IDs outside the
// stored range, which no sandbox can have written, show as -1.
func sandboxID(id uint32) int {
	if id < driver.StoredIDBase || id >= driver.StoredIDBase+driver.StoredIDSize {
		return -1
	}
	return int(id - driver.StoredIDBase)
}

// volumeError turns a file system error into an errdefs error for action;
// the message names the volume path, never a host path.
func volumeError(action string, err error) error {
	kind := errdefs.ErrInternal
	var errno syscall.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist):
		kind = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrExist):
		kind = errdefs.ErrAlreadyExists
	case errors.As(err, &errno) && (errno == syscall.ENOTDIR || errno == syscall.EISDIR || errno == syscall.ELOOP || errno == syscall.ENOTEMPTY):
		kind = errdefs.ErrFailedPrecondition
	case errors.As(err, &errno) && (errno == syscall.ENOSPC || errno == syscall.EDQUOT):
		kind = errdefs.ErrResourceExhausted
	case errors.Is(err, fs.ErrPermission):
		kind = errdefs.ErrPermissionDenied
	case strings.Contains(err.Error(), "path escapes from parent"):
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "%s: the path leaves the volume", action)
	}
	reason := err.Error()
	if errors.As(err, &errno) {
		reason = errno.Error()
	}
	return errdefs.Errorf(kind, "%s: %s", action, reason)
}
