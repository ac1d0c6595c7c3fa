// Package fake is a storage.Backend for unit tests: templates are plain
// directories and a root is a full copy of its template's files (no
// copy-on-write, no quota, no read-only seal). It is slow for big trees
// and meant only for tests that exercise the layers above storage. It
// meets the storagetest contract apart from the abilities its test
// declares missing.
package fake

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// Backend is the fake backend. FailCreateRoot, when set, makes CreateRoot
// fail before it does anything. Safe for concurrent use.
type Backend struct {
	dir string

	mu             sync.Mutex
	FailCreateRoot func(id string) error
}

var (
	_ storage.Backend = (*Backend)(nil)
	_ storage.Changes = (*Backend)(nil)
	_ storage.Volumes = (*Backend)(nil)
)

// New returns a backend keeping its trees under dir.
func New(dir string) *Backend { return &Backend{dir: dir} }

// Name returns "fake".
func (b *Backend) Name() string { return "fake" }

// CreateTemplate fills a temporary directory and renames it into place.
// Names follow the rules of the real backends (errdefs.ErrInvalidArgument
// otherwise), so that tests above storage see the same refusals.
func (b *Backend) CreateTemplate(_ context.Context, name string, fill func(string) error) error {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	final := b.TemplatePath(name)
	if _, err := os.Stat(final); err == nil {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name)
	}
	if err := os.MkdirAll(filepath.Join(b.dir, "templates"), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Join(b.dir, "templates"), fsutil.TempPrefix)
	if err != nil {
		return err
	}
	// The tree's root is the sandbox's "/", which everyone must be able
	// to traverse; MkdirTemp makes it 0700.
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := fill(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("publishing template %q: %w", name, err)
	}
	return nil
}

// DeleteTemplate removes a template tree.
func (b *Backend) DeleteTemplate(_ context.Context, name string) error {
	if err := fsutil.CheckName("template name", name); err != nil {
		return err
	}
	if _, err := os.Stat(b.TemplatePath(name)); errors.Is(err, os.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
	}
	return os.RemoveAll(b.TemplatePath(name))
}

// Templates lists complete templates.
func (b *Backend) Templates(context.Context) ([]string, error) { return b.list("templates") }

// TemplatePath is the template's directory.
func (b *Backend) TemplatePath(name string) string { return filepath.Join(b.dir, "templates", name) }

// CreateRoot copies the template into a new root directory.
func (b *Backend) CreateRoot(ctx context.Context, id, template string, opts storage.RootOptions) (string, error) {
	b.mu.Lock()
	fail := b.FailCreateRoot
	b.mu.Unlock()
	if fail != nil {
		if err := fail(id); err != nil {
			return "", err
		}
	}
	if err := fsutil.CheckName("root id", id); err != nil {
		return "", err
	}
	if err := fsutil.CheckName("template name", template); err != nil {
		return "", err
	}
	if opts.DiskBytes > 0 {
		return "", errdefs.Errorf(errdefs.ErrNotImplemented, "fake storage cannot enforce a disk limit")
	}
	src := b.TemplatePath(template)
	if _, err := os.Stat(src); err != nil {
		return "", errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", template)
	}
	dst := b.RootPath(id)
	if _, err := os.Stat(dst); err == nil {
		return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "root %s already exists", id)
	}
	if err := copyTree(src, dst); err != nil {
		os.RemoveAll(dst)
		return "", fmt.Errorf("copying template %q for %s: %w", template, id, err)
	}
	return dst, nil
}

// SetFailCreateRoot sets or clears the CreateRoot failure hook.
func (b *Backend) SetFailCreateRoot(f func(id string) error) {
	b.mu.Lock()
	b.FailCreateRoot = f
	b.mu.Unlock()
}

// DeleteRoot removes a root; idempotent.
func (b *Backend) DeleteRoot(_ context.Context, id string) error {
	if err := fsutil.CheckName("root id", id); err != nil {
		return err
	}
	return os.RemoveAll(b.RootPath(id))
}

// Roots lists the roots.
func (b *Backend) Roots(context.Context) ([]string, error) { return b.list("roots") }

// RootPath is the root's directory.
func (b *Backend) RootPath(id string) string { return filepath.Join(b.dir, "roots", id) }

// ChangesPath is the whole root (storage.Changes): a fake root is a full
// copy of its template, and replaying all of it on a fresh copy gives
// the same tree.
func (b *Backend) ChangesPath(id string) string { return b.RootPath(id) }

// Close does nothing.
func (b *Backend) Close() error { return nil }

func (b *Backend) list(sub string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(b.dir, sub))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Name()[0] != '.' {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// copyTree copies the directories, symlinks and regular files under src
// to dst with their exact modes, whatever the process umask.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, info.Mode().Perm()); err != nil {
				return err
			}
			return os.Chmod(target, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(target, data, info.Mode().Perm()); err != nil {
				return err
			}
			return os.Chmod(target, info.Mode().Perm())
		}
		return nil
	})
}
