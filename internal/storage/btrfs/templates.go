package btrfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/undo"
)

// CreateTemplate fills a fresh subvolume under a temporary name, raises
// the seed's floor above the inode numbers fill used, marks the subvolume
// read-only and renames it to name; on any failure it deletes the
// subvolume. The cost is fill's, plus a walk of the tree (one lstat per
// file), plus one unnamed file per inode by which the floor rises (the
// first template pays for all its inodes, later ones only for their excess
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
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(context.Context) error {
		if err := deleteSubvol(dir, tmp); err != nil {
			return fmt.Errorf("removing half-made template %s: %w", tmp, err)
		}
		return nil
	})
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

// TemplatePath returns the path of template name's read-only subvolume.
func (b *Backend) TemplatePath(name string) string {
	return filepath.Join(b.templatesDir(), name)
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
