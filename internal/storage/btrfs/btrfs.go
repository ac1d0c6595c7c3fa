// Package btrfs is the preferred storage backend: a template is a
// read-only btrfs subvolume, a sandbox root is a writable snapshot of it,
// and a disk limit is a qgroup limit on the root's exclusive bytes.
//
// The backend works on a btrfs filesystem: the state directory itself when
// it is on btrfs, or else a sparse image file under it, mounted through a
// loop device. Snapshots, deletes and limits go straight to the kernel
// through ioctls (no btrfs CLI on any hot path); mkfs.btrfs runs once, when
// the image is created.
//
// Layout under the btrfs tree:
//
//	templates/<name>          read-only subvolume
//	templates/.tmp-<name>-<x> template being filled; removed at startup
//	roots/<id>                writable snapshot of a template
//
// The package does not know about sandboxes, drivers or the store.
package btrfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// DefaultImageSize is the apparent size of a new loop image. The file is
// sparse: it takes only the space btrfs writes to it.
const DefaultImageSize int64 = 20 << 30

// Config configures New.
type Config struct {
	// Dir is the storage state directory, e.g. <state>/storage. It is
	// created if missing. When it is on btrfs, templates and roots live
	// directly in it; otherwise the backend keeps a btrfs filesystem in
	// the sparse image Dir/btrfs.img, mounted at Dir/mnt.
	Dir string
	// ImageSize is the size of the loop image when New creates it;
	// 0 means DefaultImageSize. An existing image keeps its size.
	ImageSize int64
	// Logger receives a few lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// Backend implements storage.Backend on btrfs. It is safe for concurrent
// use for distinct template names and root IDs.
type Backend struct {
	log  *slog.Logger
	base string // top of the btrfs tree that holds templates/ and roots/
	img  string // loop image, or "" when Config.Dir is on btrfs
	fsid string // filesystem UUID, as named under /sys/fs/btrfs

	quotaMu sync.Mutex
	quotaOn bool // qgroups known to be enabled
}

var _ storage.Backend = (*Backend)(nil)

// New opens the btrfs storage under cfg.Dir, creating and mounting the
// loop image if needed. If the image is already mounted at Dir/mnt (the
// daemon restarted), New uses that mount. It removes templates that a
// crash left half-made. Creating an image costs about 60 ms (mkfs.btrfs);
// mounting an existing one about 15 ms.
func New(ctx context.Context, cfg Config) (_ *Backend, err error) {
	if cfg.Dir == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "btrfs storage needs a directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolving storage dir %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage dir: %w", err)
	}
	// sysfs reports loop backing files by their real path.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("resolving storage dir %s: %w", cfg.Dir, err)
	}
	b := &Backend{log: cfg.Logger, base: dir}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}

	onBtrfs, err := isBtrfs(dir)
	if err != nil {
		return nil, err
	}
	if !onBtrfs {
		b.img = filepath.Join(dir, "btrfs.img")
		b.base = filepath.Join(dir, "mnt")
		size := cfg.ImageSize
		if size <= 0 {
			size = DefaultImageSize
		}
		if err := b.mount(ctx, size); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, b.Close())
			}
		}()
	}

	for _, d := range []string{b.templatesDir(), b.rootsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	fd, err := openDir(b.base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if b.fsid, err = fsid(fd); err != nil {
		return nil, fmt.Errorf("reading filesystem id of %s: %w", b.base, err)
	}
	if err := b.removeTempTemplates(); err != nil {
		return nil, err
	}
	return b, nil
}

// mount makes sure the btrfs image is mounted at b.base.
func (b *Backend) mount(ctx context.Context, size int64) error {
	if err := os.Mkdir(b.base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating mount point: %w", err)
	}
	mounted, err := fsutil.IsMountPoint(b.base)
	if err != nil {
		return err
	}
	if mounted {
		ok, err := isBtrfs(b.base)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s is mounted but is not btrfs", b.base)
		}
		b.log.Info("reusing mounted btrfs image", "path", b.base)
		return nil
	}
	if _, err := os.Stat(b.img); errors.Is(err, fs.ErrNotExist) {
		start := time.Now()
		if err := createImage(ctx, b.img, size); err != nil {
			return err
		}
		b.log.Info("created btrfs image", "path", b.img, "size_bytes", size, "duration_ms", time.Since(start).Milliseconds())
	} else if err != nil {
		return fmt.Errorf("checking image: %w", err)
	}
	return mountImage(b.img, b.base)
}

// Close unmounts the loop image and waits until its loop device is freed;
// for a state dir on btrfs it does nothing. Templates and roots stay in
// the image for the next New. It costs a few milliseconds.
//
// Sandboxes that still run on roots keep the filesystem alive through
// their own mounts of it: the unmount here succeeds, but the loop device
// stays until they exit. Close then returns an error
// wrapping errdefs.ErrFailedPrecondition after up to five seconds; the sandboxes keep working, the
// kernel frees the device when the last one exits, and a New before that
// mounts the same device again. Close is idempotent and must not run
// concurrently with other methods.
func (b *Backend) Close() error {
	if b.img == "" {
		return nil
	}
	// A reader of the tree in our mount namespace (a shell, a du) makes
	// the mount busy for a moment.
	deadline := time.Now().Add(time.Second)
	for {
		err := unix.Unmount(b.base, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("unmounting btrfs image at %s: %w", b.base, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if dev, ok := waitLoopFreed(b.img, 0); !ok {
		// Our devices are autoclear; one that someone else attached to
		// our image is not. With the filesystem mounted elsewhere, this
		// only marks the device autoclear.
		if err := detachLoop(dev); err != nil {
			return err
		}
		if dev, ok := waitLoopFreed(b.img, 5*time.Second); !ok {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition,
				"btrfs image %s is still in use through %s (by running sandboxes?); the kernel frees the device when they exit", b.img, dev)
		}
	}
	return nil
}

// Name returns "btrfs".
func (b *Backend) Name() string { return "btrfs" }

func (b *Backend) templatesDir() string { return filepath.Join(b.base, "templates") }
func (b *Backend) rootsDir() string     { return filepath.Join(b.base, "roots") }

// TemplatePath returns the path of template name's read-only subvolume.
func (b *Backend) TemplatePath(name string) string {
	return filepath.Join(b.templatesDir(), name)
}

// RootPath returns the path of root id's subvolume.
func (b *Backend) RootPath(id string) string {
	return filepath.Join(b.rootsDir(), id)
}

// CreateTemplate fills a fresh subvolume under a temporary name, marks it
// read-only and renames it to name; on any failure it deletes the
// subvolume. The cost is fill's plus about a millisecond. Names are checked
// with the rules of fsutil.CheckName (errors wrap
// errdefs.ErrInvalidArgument).
func (b *Backend) CreateTemplate(ctx context.Context, name string, fill func(dir string) error) (err error) {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	dir := b.templatesDir()
	if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %s already exists", name)
	}
	dirFd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)

	tmp := fsutil.TempName(name)
	if err := subvolCreate(dirFd, tmp); err != nil {
		return fmt.Errorf("creating subvolume for template %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			if derr := deleteSubvol(dir, tmp); derr != nil {
				err = errors.Join(err, fmt.Errorf("removing half-made template %s: %w", tmp, derr))
			}
		}
	}()
	// The tree's root becomes the sandbox's "/": 0755 whatever our umask.
	if err := os.Chmod(filepath.Join(dir, tmp), 0o755); err != nil {
		return fmt.Errorf("creating subvolume for template %s: %w", name, err)
	}
	if err := fill(filepath.Join(dir, tmp)); err != nil {
		return fmt.Errorf("filling template %s: %w", name, err)
	}
	if err := setReadOnly(filepath.Join(dir, tmp), true); err != nil {
		return fmt.Errorf("sealing template %s: %w", name, err)
	}
	// RENAME_NOREPLACE makes a concurrent CreateTemplate of the same name
	// lose cleanly instead of replacing the winner.
	if err := unix.Renameat2(dirFd, tmp, dirFd, name, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %s already exists", name)
		}
		return fmt.Errorf("publishing template %s: %w", name, err)
	}
	return nil
}

// DeleteTemplate deletes template name's subvolume. Roots snapshotted from
// it are independent subvolumes and keep working. The kernel frees the
// space in the background.
func (b *Backend) DeleteTemplate(ctx context.Context, name string) error {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	if _, err := os.Lstat(b.TemplatePath(name)); errors.Is(err, fs.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", name)
	}
	if err := deleteSubvol(b.templatesDir(), name); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	return nil
}

// Templates lists the complete templates, sorted. It reads one directory.
func (b *Backend) Templates(ctx context.Context) ([]string, error) {
	return fsutil.ListNames(b.templatesDir())
}

// CreateRoot snapshots template into roots/<id>: one ioctl, 2.5-7 ms
// measured on the loop image, nearly all of it the transaction commit that
// a snapshot implies. With opts.DiskBytes > 0 it
// enables quotas on the filesystem the first time (which costs a rescan),
// and limits the root's exclusive bytes, so that writes beyond the limit
// fail with EDQUOT. Subvolumes the sandbox creates inside the root escape
// the limit; see SubvolumeIoctls. Unknown templates return an error wrapping
// errdefs.ErrNotFound, an existing id one wrapping ErrAlreadyExists.
func (b *Backend) CreateRoot(ctx context.Context, id, template string, opts storage.RootOptions) (_ string, err error) {
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	if err := fsutil.CheckName("template name", template); err != nil {
		return "", err
	}
	if opts.DiskBytes < 0 {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "negative disk limit %d for root %s", opts.DiskBytes, id)
	}
	srcFd, err := openDir(b.TemplatePath(template))
	if errors.Is(err, unix.ENOENT) {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", template)
	}
	if err != nil {
		return "", err
	}
	defer unix.Close(srcFd)
	if opts.DiskBytes > 0 {
		if err := b.ensureQuota(); err != nil {
			return "", fmt.Errorf("enabling disk quotas for %s: %w", id, err)
		}
	}
	rootsFd, err := openDir(b.rootsDir())
	if err != nil {
		return "", err
	}
	defer unix.Close(rootsFd)

	if err := snapshot(srcFd, rootsFd, id, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "root %s already exists", id)
		}
		return "", fmt.Errorf("creating snapshot of %s for %s: %w", template, id, err)
	}
	path := b.RootPath(id)
	if opts.DiskBytes > 0 {
		defer func() {
			if err != nil {
				if derr := b.DeleteRoot(ctx, id); derr != nil {
					err = errors.Join(err, derr)
				}
			}
		}()
		if err := limitRoot(path, uint64(opts.DiskBytes)); err != nil {
			return "", fmt.Errorf("limiting disk of %s to %d bytes: %w", id, opts.DiskBytes, err)
		}
	}
	return path, nil
}

// DeleteRoot deletes root id's subvolume, including any subvolumes a
// sandbox created inside it (found by walking the tree, which only happens
// when the plain delete reports them). A missing root is not an error.
// The kernel unlinks the subvolume at once (about 0.2 ms measured) and
// frees its extents in the background.
//
// When quotas are on, the root's qgroup is removed too. The kernel only
// allows that once its cleaner has dropped the subvolume, so DeleteRoot
// then commits the filesystem (BTRFS_IOC_SYNC, which wakes the cleaner)
// and retries for up to two seconds; this makes DeleteRoot cost a
// transaction commit (about 14 ms measured on an idle filesystem, more
// while sandboxes write). A qgroup that still cannot be removed is logged and
// left for the kernel, which drops the qgroups of dropped subvolumes
// itself (since Linux 6.10 or so).
func (b *Backend) DeleteRoot(ctx context.Context, id string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	path := b.RootPath(id)
	var qgroup uint64
	if b.quotasEnabled() {
		if fd, err := openDir(path); err == nil {
			qgroup, _ = subvolID(fd)
			unix.Close(fd)
		}
	}
	if err := deleteSubvol(b.rootsDir(), id); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	if qgroup != 0 {
		b.removeQgroup(ctx, qgroup)
	}
	return nil
}

// Roots lists the roots, sorted. It reads one directory.
func (b *Backend) Roots(ctx context.Context) ([]string, error) {
	return fsutil.ListNames(b.rootsDir())
}

// removeTempTemplates deletes the templates that a crash left unfinished.
func (b *Backend) removeTempTemplates() error {
	entries, err := os.ReadDir(b.templatesDir())
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), fsutil.TempPrefix) {
			continue
		}
		if err := deleteSubvol(b.templatesDir(), e.Name()); err != nil {
			return fmt.Errorf("removing unfinished template %s: %w", e.Name(), err)
		}
		b.log.Info("removed unfinished template", "path", filepath.Join(b.templatesDir(), e.Name()))
	}
	return nil
}

func (b *Backend) qgroupsSysfs() string {
	return filepath.Join("/sys/fs/btrfs", b.fsid, "qgroups")
}

// quotasEnabled reports whether qgroup accounting is on: sysfs shows a
// qgroups directory for the filesystem exactly then.
func (b *Backend) quotasEnabled() bool {
	_, err := os.Stat(b.qgroupsSysfs())
	return err == nil
}

// ensureQuota enables qgroups the first time a limit is asked for, so a
// filesystem that never needs a limit never pays for quota accounting.
func (b *Backend) ensureQuota() error {
	b.quotaMu.Lock()
	defer b.quotaMu.Unlock()
	if b.quotaOn || b.quotasEnabled() {
		b.quotaOn = true
		return nil
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := enableQuota(fd); err != nil {
		return err
	}
	b.quotaOn = true
	b.log.Info("enabled btrfs quotas", "path", b.base)
	return nil
}

// removeQgroup removes qgroup 0/id of a deleted subvolume; see DeleteRoot.
func (b *Backend) removeQgroup(ctx context.Context, id uint64) {
	fd, err := openDir(b.base)
	if err != nil {
		b.log.Warn("cannot remove qgroup", "qgroup", fmt.Sprintf("0/%d", id), "err", err)
		return
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(2 * time.Second)
	synced := false
	for {
		err := destroyQgroup(fd, id)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		if errors.Is(err, unix.EBUSY) && !synced {
			synced = true
			if err = syncFS(fd); err == nil {
				continue
			}
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) || ctx.Err() != nil {
			b.log.Warn("leaving qgroup of deleted root to the kernel", "qgroup", fmt.Sprintf("0/%d", id), "err", err)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// limitRoot limits the exclusive bytes of the subvolume at path.
func limitRoot(path string, bytes uint64) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return fmt.Errorf("looking up subvolume id of %s: %w", path, err)
	}
	return limitExclusive(fd, id, bytes)
}

// deleteSubvol deletes the subvolume parent/name and every subvolume
// nested in it. A missing name is not an error; a plain directory (which
// no code path creates, but a crash or a human might) is removed as such.
func deleteSubvol(parent, name string) error {
	path := filepath.Join(parent, name)
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !isSubvolRoot(st) {
		return os.RemoveAll(path)
	}
	dirFd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	err = snapDestroy(dirFd, name)
	if errors.Is(err, unix.ENOTEMPTY) {
		// The subvolume holds others; the kernel deletes only leaves. A
		// read-only subvolume cannot have its children unlinked, so clear
		// the flag first (we are deleting it anyway).
		if err := setReadOnly(path, false); err != nil {
			return err
		}
		if err := deleteNested(path); err != nil {
			return err
		}
		err = snapDestroy(dirFd, name)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("destroying subvolume %s: %w", path, err)
	}
	return nil
}

// deleteNested deletes the subvolumes inside the subvolume at path.
func deleteNested(path string) error {
	var nested []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == path {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if isSubvolRoot(info) {
			nested = append(nested, p)
			return fs.SkipDir // deleteSubvol handles what is inside it
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("finding subvolumes inside %s: %w", path, err)
	}
	slices.Reverse(nested)
	for _, p := range nested {
		if err := deleteSubvol(filepath.Dir(p), filepath.Base(p)); err != nil {
			return err
		}
	}
	return nil
}

// isSubvolRoot reports whether st is the root directory of a subvolume:
// on btrfs those, and only those, have inode number 256
// (BTRFS_FIRST_FREE_OBJECTID).
func isSubvolRoot(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.IsDir() && sys.Ino == firstFreeObjectID
}

// setReadOnly sets or clears the read-only flag of the subvolume at path.
func setReadOnly(path string, ro bool) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := subvolFlags(fd)
	if err != nil {
		return fmt.Errorf("reading flags of subvolume %s: %w", path, err)
	}
	want := flags &^ subvolRdonly
	if ro {
		want |= subvolRdonly
	}
	if want == flags {
		return nil
	}
	if err := setSubvolFlags(fd, want); err != nil {
		return fmt.Errorf("setting flags of subvolume %s: %w", path, err)
	}
	return nil
}

func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("checking filesystem of %s: %w", path, err)
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}
