package ovl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// Remount mounts the overlay of root id at merged again, on the upper
// and work directories it has and the template tree its lower file
// names, when merged is not a mount point already; merged is made when
// missing. It returns merged. A root without its directory or lower file
// returns an error wrapping errdefs.ErrNotFound.
func (l *Layers) Remount(id, merged string, idmap *os.File) (string, error) {
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	return merged, l.remount(id, merged, idmap)
}

// UnmountRoot unmounts the overlay of root id at merged, keeping its
// layers (Unmount).
func UnmountRoot(ctx context.Context, id, merged string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	return Unmount(ctx, merged)
}

func (l *Layers) remount(id, merged string, idmap *os.File) error {
	if mounted, err := fsutil.IsMountPoint(merged); err != nil || mounted {
		return err
	}
	dir := filepath.Join(l.cfg.Roots, id)
	b, err := os.ReadFile(filepath.Join(dir, "lower"))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrNotFound, "root %s not found", id)
	}
	if err != nil {
		return fmt.Errorf("mounting root %s again: %w", id, err)
	}
	if err := os.MkdirAll(merged, 0o755); err != nil {
		return fmt.Errorf("mounting root %s again: %w", id, err)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	lower, err := l.tree(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("mounting root %s again: %w", id, err)
	}
	if idmap != nil {
		if err := mountMapped(lower, dir, merged, idmap); err != nil {
			return fmt.Errorf("mounting overlay of root %s again: %w", id, err)
		}
		return nil
	}
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	opt := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", lower, upper, work, options)
	if err := unix.Mount("overlay", merged, "overlay", 0, opt); err != nil {
		return fmt.Errorf("mounting overlay of root %s again: %w", id, err)
	}
	return nil
}

// tree returns the path of the template tree whose ID is tid: a deleted
// template's, by its name, or a published one's, found by asking each
// for its ID. The caller holds mu.
func (l *Layers) tree(tid string) (string, error) {
	deleted := filepath.Join(l.cfg.Templates, DeletedPrefix+tid)
	if _, err := os.Lstat(deleted); err == nil {
		return deleted, nil
	}
	names, err := fsutil.ListNames(l.cfg.Templates)
	if err != nil {
		return "", err
	}
	for _, n := range names {
		p := filepath.Join(l.cfg.Templates, n)
		if id, err := l.cfg.TreeID(p); err == nil && id == tid {
			return p, nil
		}
	}
	return "", errdefs.Errorf(errdefs.ErrNotFound, "template tree %s of the root is gone", tid)
}
