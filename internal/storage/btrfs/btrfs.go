// Package btrfs is the preferred storage backend: a template is a
// read-only btrfs subvolume, a sandbox root is an overlayfs mount with the
// template as its lower layer and its upper layer in a subvolume of its
// own, and a disk limit is a qgroup limit on that subvolume.
//
// Why overlay over btrfs rather than a writable snapshot of the template
// (the layout before): the files of a snapshot are inodes of their own, so
// every sandbox read its binaries and libraries again from disk and cached
// its own copy of them. Through overlayfs every root reads the template's
// own inodes, and N sandboxes share one page cache copy. Measured on the
// loop image (BenchmarkFirstRead: first read of a 2 MB template file in a
// fresh root, template cached): 1.2-1.5 ms through the overlay, the same
// as a cached read of the template itself, against 4.7-6.9 ms through a
// snapshot. What the sandbox writes still lands in a subvolume, which
// keeps the qgroup limit exact, and copy-up clones the template's extents
// instead of copying data, because both layers are on one btrfs
// filesystem (measured: appending a byte to a 64 MiB template file takes
// under 0.1 ms and adds 20 KiB of exclusive bytes).
//
// Overlayfs reports the layers' real inode numbers when all of them are on
// one filesystem, but btrfs numbers inodes per subvolume, so a fresh
// upper subvolume would hand out the numbers the template already uses:
// two different files in one root would share st_dev and st_ino (the
// root directory itself and the template's first directory, for one),
// which breaks cp ("are the same file"), find (loop detection) and hard
// link detection. So a root's subvolume is a snapshot of the seed, a tiny
// subvolume holding one empty file whose inode number is above every
// template's, and new inodes in the root are numbered above it.
// CreateTemplate raises the seed's floor when a template needs it. A
// snapshot costs a transaction commit (1.6-4 ms); an empty subvolume is
// cheaper to create (0.4 ms) but gets committed all the same, when
// DeleteRoot unmounts the overlay (which syncs the upper filesystem), so
// create and delete together cost no less. The snapshot is therefore
// taken ahead of time: the backend keeps a few spare snapshots of the
// seed (spares.go) and CreateRoot renames one into place.
//
// The backend works on a btrfs filesystem: the state directory itself when
// it is on btrfs, or else a sparse image file under it, mounted through a
// loop device. Snapshots, deletes and limits go straight to the kernel
// through ioctls (no btrfs CLI on any hot path); mkfs.btrfs runs once, when
// the image is created.
//
// Layout under the btrfs tree (Dir, or Dir/mnt for the image):
//
//	templates/<name>          read-only subvolume: the lower layer
//	templates/.tmp-<name>-<x> template being filled; removed at startup
//	templates/.deleted-<sid>  deleted template that roots still use (<sid>: subvolume ID)
//	seed/floor                empty file numbered above every template inode
//	spares/<floor>-<x>        snapshot of seed, ready to become a root
//	roots/<id>                snapshot of seed: the root's subvolume, with the disk limit
//	roots/<id>/upper, work    overlayfs upper and work dirs
//	roots/<id>/lower          subvolume ID of the template in use
//
// and, outside the btrfs mount so that Close can unmount it while roots
// are mounted, Dir/merged/<id>: the overlay mount, the root's path. The
// overlay mount and the keeping of deleted templates are shared with the
// overlay backend (package ovl).
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/storage/internal/ovl"
)

// DefaultImageSize is the apparent size of a new loop image. The file is
// sparse: it takes only the space btrfs writes to it.
const DefaultImageSize int64 = 20 << 30

// Config configures New.
type Config struct {
	// Dir is the storage state directory, e.g. <state>/storage. It is
	// created if missing. When it is on btrfs, templates and roots live
	// directly in it; otherwise the backend keeps a btrfs filesystem in
	// the sparse image Dir/btrfs.img, mounted at Dir/mnt. Roots are
	// mounted at Dir/merged/<id>. Dir may not contain ',', ':' or '\',
	// which overlayfs mount options reserve.
	Dir string
	// ImageSize is the size of the loop image when New creates it;
	// 0 means DefaultImageSize. An existing image keeps its size.
	ImageSize int64
	// QuotaMode is how disk limits are accounted once a root asks for
	// one: QuotaSimple (the default; full where the kernel lacks simple
	// quotas) or QuotaFull. Quotas that an earlier daemon enabled in full
	// mode are switched to simple ones when QuotaMode is QuotaSimple.
	QuotaMode string
	// QuotaCheckInterval is how often the accounting's state is checked
	// and deleted roots' qgroups are removed; 0 means
	// DefaultQuotaCheckInterval.
	QuotaCheckInterval time.Duration
	// Logger receives a few lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// Backend implements storage.Backend on btrfs. It is safe for concurrent
// use for distinct template names and root IDs.
type Backend struct {
	log    *slog.Logger
	dir    string // Config.Dir, resolved
	base   string // top of the btrfs tree that holds templates/ and roots/
	img    string // loop image, or "" when Config.Dir is on btrfs
	fsid   string // filesystem UUID, as named under /sys/fs/btrfs
	layers *ovl.Layers

	// seedMu orders raising the seed's floor (writer) against taking
	// snapshots of the seed (readers).
	seedMu sync.RWMutex
	floor  uint64 // inode number of seed/floor; under seedMu

	// spareMu guards the spare roots (spares.go): the names of those
	// ready in spares/ and the number being made.
	spareMu      sync.Mutex
	spares       []string
	sparesMaking int

	quota quota // quota.go
}

var (
	_ storage.Backend       = (*Backend)(nil)
	_ storage.Changes       = (*Backend)(nil)
	_ storage.QuotaReporter = (*Backend)(nil)
)

// New opens the btrfs storage under cfg.Dir, creating and mounting the
// loop image if needed. If the image is already mounted at Dir/mnt (the
// daemon restarted), New uses that mount; roots that are still mounted
// stay as they are. It removes templates that a crash left half-made and
// deleted templates that no root uses anymore, and makes the spare roots
// (a snapshot each, about 2 ms). Creating an image costs about 60 ms
// (mkfs.btrfs); mounting an existing one about 15 ms.
func New(ctx context.Context, cfg Config) (_ *Backend, err error) {
	if cfg.Dir == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "btrfs storage needs a directory")
	}
	if err := checkQuotaMode(cfg.QuotaMode); err != nil {
		return nil, err
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
	if err := ovl.CheckDir(dir); err != nil {
		return nil, err
	}
	b := &Backend{log: cfg.Logger, dir: dir, base: dir}
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

	for _, d := range []string{b.templatesDir(), b.rootsDir(), b.sparesDir(), b.mergedDir()} {
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
	b.layers = ovl.New(ovl.Config{
		Templates: b.templatesDir(),
		Roots:     b.rootsDir(),
		TreeID:    treeID,
		RemoveTree: func(_ context.Context, path string) error {
			return deleteSubvol(filepath.Dir(path), filepath.Base(path))
		},
		Logger: b.log,
	})
	if err := b.removeTempTemplates(); err != nil {
		return nil, err
	}
	if err := b.ensureSeed(); err != nil {
		return nil, err
	}
	if err := b.readFloor(); err != nil {
		return nil, err
	}
	if err := b.loadSpares(); err != nil {
		return nil, err
	}
	if err := b.fillSpares(ctx); err != nil {
		return nil, err
	}
	if err := b.layers.Collect(ctx); err != nil {
		return nil, err
	}
	if err := b.openQuota(cfg); err != nil {
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
// Roots that are still mounted (and sandboxes running on them) keep the
// filesystem alive: the unmount here succeeds, but the loop device stays
// until they are unmounted. Close then returns an error wrapping
// errdefs.ErrFailedPrecondition after up to five seconds; the roots keep
// working, the kernel frees the device when the last one goes, and a New
// before that mounts the same device again. Close is idempotent and must
// not run concurrently with other methods.
func (b *Backend) Close() error {
	b.closeQuota()
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
				"btrfs image %s is still in use through %s (by mounted roots?); the kernel frees the device when they go", b.img, dev)
		}
	}
	return nil
}

// Name returns "btrfs".
func (b *Backend) Name() string { return "btrfs" }

func (b *Backend) templatesDir() string { return filepath.Join(b.base, "templates") }
func (b *Backend) rootsDir() string     { return filepath.Join(b.base, "roots") }
func (b *Backend) seedDir() string      { return filepath.Join(b.base, "seed") }
func (b *Backend) mergedDir() string    { return filepath.Join(b.dir, "merged") }

// TemplatePath returns the path of template name's read-only subvolume.
func (b *Backend) TemplatePath(name string) string {
	return filepath.Join(b.templatesDir(), name)
}

// ScratchDir returns the path of the directory name at the top of the
// btrfs tree (next to templates/ and roots/), creating it mode 0700. It is
// for callers that keep trees of their own which they later copy into
// templates, such as image build snapshots: on the same filesystem, a copy
// clones extents (FICLONE) instead of copying data. The backend never
// looks inside it; Close unmounts it with the rest of the image, so the
// caller stops using it first. name must be a plain name other than the
// backend's own directories.
func (b *Backend) ScratchDir(name string) (string, error) {
	switch name {
	case "", ".", "..", "templates", "roots", "seed", "spares":
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "scratch directory name %q is reserved", name)
	}
	if strings.ContainsRune(name, '/') {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "scratch directory name %q is not a plain name", name)
	}
	dir := filepath.Join(b.base, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating scratch directory %s: %w", dir, err)
	}
	return dir, nil
}

// RootPath returns the path of root id's overlay mount, Dir/merged/<id>.
func (b *Backend) RootPath(id string) string {
	return filepath.Join(b.mergedDir(), id)
}

// ChangesPath is the upper directory of root id, in its subvolume
// (storage.Changes).
func (b *Backend) ChangesPath(id string) string {
	return filepath.Join(b.rootsDir(), id, "upper")
}

// CreateTemplate fills a fresh subvolume under a temporary name, raises
// the seed's floor above the inode numbers fill used, marks the subvolume
// read-only and renames it to name; on any failure it deletes the
// subvolume. The cost is fill's, plus a walk of the tree (one lstat per
// file), plus about 20 µs per inode by which the floor rises (the first
// template of N files pays about N of those, later ones only their excess
// over the largest template so far), plus new spare roots (a snapshot
// each, since the floor changed). Names are checked with the rules of
// fsutil.CheckName (errors wrap errdefs.ErrInvalidArgument).
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
	if err := b.raiseFloor(filepath.Join(dir, tmp)); err != nil {
		return fmt.Errorf("sealing template %s: %w", name, err)
	}
	if err := setReadOnly(filepath.Join(dir, tmp), true); err != nil {
		return fmt.Errorf("sealing template %s: %w", name, err)
	}
	if err := b.layers.Publish(ctx, filepath.Join(dir, tmp), name, nil); err != nil {
		return err
	}
	// Raising the floor made the spares useless; make new ones now rather
	// than in the next CreateRoot.
	if err := b.fillSpares(ctx); err != nil {
		b.log.Warn("cannot make spare roots", "err", err)
	}
	return nil
}

// DeleteTemplate removes template name. If no root uses it, its subvolume
// is deleted now (the kernel frees the space in the background);
// otherwise it is renamed out of sight and deleted with the last root
// that uses it, since overlayfs must not lose a lower layer under a
// mounted root. Unknown names return an error wrapping errdefs.ErrNotFound.
func (b *Backend) DeleteTemplate(ctx context.Context, name string) error {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	return b.layers.DeleteTemplate(ctx, name, nil)
}

// Templates lists the complete templates, sorted. It reads one directory.
func (b *Backend) Templates(ctx context.Context) ([]string, error) {
	return b.layers.Templates()
}

// CreateRoot renames a spare snapshot of the seed to roots/<id> (or, with
// no spare left, snapshots the seed there), makes the upper and work dirs
// in it and mounts the overlay of template at Dir/merged/<id>. With a
// spare it costs about 1 ms measured on the loop image (no transaction
// commit), 1.2 ms with a disk limit; without, 2.6-3.4 ms. With
// opts.DiskBytes > 0 it enables quotas on the filesystem the first time
// (which costs a rescan) and limits the exclusive bytes of roots/<id>, so
// that the sandbox's writes beyond the limit fail with EDQUOT. Extents
// that copy-up clones from the template are shared, not exclusive, so
// changing a template file counts only the changed bytes. The sandbox sees
// overlayfs, which rejects btrfs ioctls, so it cannot make subvolumes that
// would escape the limit. Unknown templates return an error wrapping
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
	// Checked again, under the layers' lock, when mounting; this only
	// spares a snapshot for a name that is plainly wrong.
	if _, err := os.Lstat(b.TemplatePath(template)); errors.Is(err, fs.ErrNotExist) {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "template %s not found", template)
	}
	if opts.DiskBytes > 0 {
		if err := b.ensureQuota(); err != nil {
			return "", fmt.Errorf("enabling disk quotas for %s: %w", id, err)
		}
		if err := b.limitedRootAllowed(id); err != nil {
			return "", err
		}
	}
	took, err := b.takeSpare(id)
	if !took && err == nil {
		err = b.snapshotSeed(id)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "root %s already exists", id)
		}
		return "", fmt.Errorf("creating subvolume for root %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			if derr := b.DeleteRoot(ctx, id); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	if opts.DiskBytes > 0 {
		if err := limitRoot(filepath.Join(b.rootsDir(), id), uint64(opts.DiskBytes)); err != nil {
			return "", fmt.Errorf("limiting disk of %s to %d bytes: %w", id, opts.DiskBytes, err)
		}
	}
	merged := b.RootPath(id)
	if err := os.Mkdir(merged, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("creating root %s: %w", id, err)
	}
	if err := b.layers.Mount(id, template, merged); err != nil {
		return "", err
	}
	return merged, nil
}

// DeleteRoot unmounts root id (retrying for a second while busy, then
// detaching lazily), removes its mount point and deletes its subvolume,
// including any subvolumes nested in it (found by walking the tree, which
// only happens when the plain delete reports them). A root whose mount is
// already gone (host reboot, crash during create) is deleted just the
// same; a missing root is not an error. Unmounting an overlay syncs its
// upper filesystem, which on btrfs is a transaction commit (about 2 ms
// measured); the kernel unlinks the subvolume at once and frees its
// extents in the background. Then DeleteRoot makes up the spare roots
// that creates took (a snapshot each, about 2 ms); a failure there is
// logged, not returned, since the root is gone.
//
// When quotas are on, the root's qgroup goes too, but not at once: it is
// removed in the background once the kernel's cleaner has dropped the
// subvolume and its counts are back to zero (see quota.go), since removing
// a qgroup that still counts bytes corrupts full accounting.
func (b *Backend) DeleteRoot(ctx context.Context, id string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	merged := b.RootPath(id)
	if err := ovl.Unmount(ctx, merged); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	// No longer a mount point, so nothing below it is the root's: at most
	// strays written into the bare mount point.
	if err := os.RemoveAll(merged); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	_, statErr := os.Lstat(filepath.Join(b.rootsDir(), id))
	if err := b.deleteRootSubvol(b.rootsDir(), id); err != nil {
		return fmt.Errorf("deleting root %s: %w", id, err)
	}
	if err := b.layers.Collect(ctx); err != nil {
		return err
	}
	if statErr != nil {
		return nil // there was no root: nothing to replace
	}
	if err := b.fillSpares(ctx); err != nil {
		// The root is gone; the next CreateRoot snapshots the seed itself.
		b.log.Warn("cannot make spare roots", "err", err)
	}
	return nil
}

// deleteRootSubvol deletes the subvolume parent/name of a root or a spare
// and, when quotas are on, hands its qgroup to the quota watcher, which
// removes it once the kernel has given back every byte it counted
// (quota.go).
func (b *Backend) deleteRootSubvol(parent, name string) error {
	var qgroup uint64
	if b.quotasEnabled() {
		qgroup, _ = subvolIDAt(filepath.Join(parent, name))
	}
	if err := deleteSubvol(parent, name); err != nil {
		return err
	}
	if qgroup != 0 {
		b.dropQgroup(qgroup)
	}
	return nil
}

// Roots lists the roots, sorted. It reads one directory.
func (b *Backend) Roots(ctx context.Context) ([]string, error) {
	return fsutil.ListNames(b.rootsDir())
}

// ensureSeed creates the seed when it is missing: on the first New, or the
// first after an upgrade from the snapshot layout, when templates may
// already exist. It builds the seed under a temporary name and renames it
// into place, so a crash cannot leave a seed whose floor is too low.
func (b *Backend) ensureSeed() error {
	if _, err := os.Lstat(b.seedDir()); err == nil {
		return nil
	}
	const tmp = ".seed-new"
	if err := deleteSubvol(b.base, tmp); err != nil {
		return fmt.Errorf("removing unfinished seed: %w", err)
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := subvolCreate(fd, tmp); err != nil {
		return fmt.Errorf("creating seed: %w", err)
	}
	templates, err := os.ReadDir(b.templatesDir())
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var floor uint64
	for _, t := range templates {
		n, err := maxIno(filepath.Join(b.templatesDir(), t.Name()))
		if err != nil {
			return err
		}
		floor = max(floor, n)
	}
	if err := raiseFloor(filepath.Join(b.base, tmp), floor); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(b.base, tmp), b.seedDir()); err != nil {
		return fmt.Errorf("creating seed: %w", err)
	}
	return nil
}

// raiseFloor makes the seed's floor exceed the inode numbers in the
// template tree at dir.
func (b *Backend) raiseFloor(dir string) error {
	n, err := maxIno(dir)
	if err != nil {
		return err
	}
	b.seedMu.Lock()
	defer b.seedMu.Unlock()
	if err := raiseFloor(b.seedDir(), n); err != nil {
		return err
	}
	return b.readFloor()
}

// snapshotSeed creates roots/<id> as a snapshot of the seed.
func (b *Backend) snapshotSeed(id string) error {
	seedFd, err := openDir(b.seedDir())
	if err != nil {
		return err
	}
	defer unix.Close(seedFd)
	rootsFd, err := openDir(b.rootsDir())
	if err != nil {
		return err
	}
	defer unix.Close(rootsFd)
	b.seedMu.RLock()
	defer b.seedMu.RUnlock()
	return snapshot(seedFd, rootsFd, id, 0)
}

// raiseFloor makes sure that seed/floor has an inode number above n. btrfs
// numbers a subvolume's new inodes from one past the largest number in
// it (counted again at every mount), so a snapshot of the seed numbers
// its inodes above the floor. The only way to move the counter is to use
// numbers up: it takes unnamed files (O_TMPFILE, freed on close) until the
// counter passes n, about 20 µs each, then links a new floor in.
func raiseFloor(seed string, n uint64) error {
	floor := filepath.Join(seed, "floor")
	var st unix.Stat_t
	if err := unix.Lstat(floor, &st); err == nil && st.Ino > n {
		return nil
	}
	for st.Ino < n {
		fd, err := unix.Open(seed, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("raising inode floor of %s: %w", seed, err)
		}
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("raising inode floor of %s: %w", seed, err)
		}
	}
	next := floor + ".new"
	if err := os.Remove(next); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	f, err := os.OpenFile(next, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	if err := os.Rename(next, floor); err != nil {
		return fmt.Errorf("raising inode floor of %s: %w", seed, err)
	}
	return nil
}

// maxIno returns the largest inode number in the tree at dir.
func maxIno(dir string) (uint64, error) {
	var n uint64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			n = max(n, sys.Ino)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("reading inode numbers of %s: %w", dir, err)
	}
	return n, nil
}

// treeID names a template tree by its subvolume ID: every subvolume's root
// directory has inode number 256, so the overlay backend's inode numbers
// would not tell templates apart.
func treeID(path string) (string, error) {
	fd, err := openDir(path)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return "", fmt.Errorf("looking up subvolume id of %s: %w", path, err)
	}
	return strconv.FormatUint(id, 10), nil
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

// subvolIDAt returns the ID of the subvolume whose top directory is path.
func subvolIDAt(path string) (uint64, error) {
	fd, err := openDir(path)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return 0, fmt.Errorf("looking up subvolume id of %s: %w", path, err)
	}
	return id, nil
}

func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("checking filesystem of %s: %w", path, err)
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}
