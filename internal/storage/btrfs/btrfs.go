package btrfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/storage/internal/ovl"
	"github.com/corralrun/corral/internal/undo"
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
// deleted templates that no root uses anymore, and makes the spare roots.
// Creating an image runs mkfs.btrfs, so the first New is the slowest.
func New(ctx context.Context, cfg Config) (_ *Backend, err error) {
	if cfg.Dir == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "btrfs storage needs a directory")
	}
	if err := checkQuotaMode(cfg.QuotaMode); err != nil {
		return nil, err
	}
	dir, err := resolveDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	b := &Backend{log: cfg.Logger, dir: dir, base: dir}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	if err := b.openFilesystem(ctx, cfg.ImageSize, &u); err != nil {
		return nil, err
	}
	if err := b.openTree(); err != nil {
		return nil, err
	}
	if err := b.recover(ctx); err != nil {
		return nil, err
	}
	if err := b.openQuota(cfg); err != nil {
		return nil, err
	}
	return b, nil
}

// resolveDir creates the state directory and returns its real path, which
// is how sysfs reports loop backing files.
func resolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving storage dir %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("creating storage dir: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", fmt.Errorf("resolving storage dir %s: %w", dir, err)
	}
	if err := ovl.CheckDir(abs); err != nil {
		return "", err
	}
	return abs, nil
}

// openFilesystem uses b.dir as the btrfs tree when it is on btrfs, and
// otherwise mounts the loop image (creating one of size bytes if there is
// none), registering its unmount on u.
func (b *Backend) openFilesystem(ctx context.Context, size int64, u *undo.Stack) error {
	onBtrfs, err := isBtrfs(b.dir)
	if err != nil || onBtrfs {
		return err
	}
	b.img = filepath.Join(b.dir, "btrfs.img")
	b.base = filepath.Join(b.dir, "mnt")
	if size <= 0 {
		size = DefaultImageSize
	}
	if err := b.mount(ctx, size); err != nil {
		return err
	}
	u.Add(func(context.Context) error { return b.Close() })
	return nil
}

// openTree makes the backend's directories and reads the filesystem's
// identity, then opens the overlay layers on the tree.
func (b *Backend) openTree() error {
	for _, d := range []string{b.templatesDir(), b.rootsDir(), b.sparesDir(), b.mergedDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if b.fsid, err = fsid(fd); err != nil {
		return fmt.Errorf("reading filesystem id of %s: %w", b.base, err)
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
	return nil
}

// recover brings the tree to a state CreateRoot can rely on after a crash:
// no half-made templates, a seed and its floor, spare roots that match the
// floor, and no deleted template that no root uses.
func (b *Backend) recover(ctx context.Context) error {
	if err := b.removeTempTemplates(); err != nil {
		return err
	}
	if err := b.ensureSeed(); err != nil {
		return err
	}
	if err := b.readFloor(); err != nil {
		return err
	}
	if err := b.loadSpares(); err != nil {
		return err
	}
	if err := b.fillSpares(ctx); err != nil {
		return err
	}
	return b.layers.Collect(ctx)
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
// the image for the next New.
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
	case "", ".", "..", "templates", "roots", "seed", "spares", "volumes":
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
