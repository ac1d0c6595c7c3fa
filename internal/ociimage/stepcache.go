package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
)

// StepCache keeps the trees that build steps produce, one per step
// cache key. A committed snapshot never changes. The builder prepares a
// writable copy of a parent snapshot, lets a step change it, and commits
// it under the step's key; on a rebuild, a key that exists is a cache hit.
// A backend with cheap snapshots (btrfs subvolumes) implements Prepare as
// a writable snapshot of the parent and Commit as making it read-only
// under its key; DirStepCache is the portable one.
//
// Implementations are safe for concurrent use. Two builds may commit the
// same key; the second commit discards its tree, which is the same.
type StepCache interface {
	// Has reports whether a snapshot named key is committed.
	Has(ctx context.Context, key string) (bool, error)
	// Prepare returns a new writable directory holding a copy of the
	// committed snapshot parent, or an empty one when parent is "".
	Prepare(ctx context.Context, parent string) (dir string, err error)
	// Commit makes the prepared dir the snapshot key. dir is gone after
	// Commit returns, whatever the result.
	Commit(ctx context.Context, dir, key string) error
	// Abort removes a prepared dir that will not be committed.
	Abort(ctx context.Context, dir string) error
	// Export copies the snapshot key into dir, an existing empty
	// directory (a template being filled).
	Export(ctx context.Context, key, dir string) error
}

// DirStepCache keeps snapshots as plain directory trees under one
// directory:
//
//	snapshots/<key>/   committed trees
//	work/<random>/     prepared trees
//
// Prepare and Export copy whole trees. Files are cloned (FICLONE) where
// the filesystem shares extents (btrfs, XFS), so a copy costs metadata
// only; elsewhere they are copied with copy_file_range, which costs the
// tree's size in disk writes. Ownership, permission bits, times, symlinks
// and hard links are kept; extended attributes, device nodes, FIFOs and
// sockets are not.
type DirStepCache struct {
	dir string
	// mu is held shared by every operation and exclusively by GC.
	mu sync.RWMutex
}

var _ StepCache = (*DirStepCache)(nil)

// OpenDirStepCache opens (creating if needed) snapshots under dir and
// removes prepared trees that a crashed process left behind. One
// DirStepCache per directory.
func OpenDirStepCache(dir string) (*DirStepCache, error) {
	s := &DirStepCache{dir: dir}
	if err := os.RemoveAll(s.workDir()); err != nil {
		return nil, fmt.Errorf("clearing build work directories: %w", err)
	}
	for _, d := range []string{s.snapDir(), s.workDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating build snapshot directory: %w", err)
		}
	}
	return s, nil
}

func (s *DirStepCache) snapDir() string { return filepath.Join(s.dir, "snapshots") }
func (s *DirStepCache) workDir() string { return filepath.Join(s.dir, "work") }

// checkKey refuses keys that are not safe file names. Build keys are hex.
func checkKey(key string) error {
	if key == "" || len(key) > 128 || strings.Trim(key, "0123456789abcdef") != "" {
		return fmt.Errorf("snapshot key %q is not lower-case hex: %w", key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Has implements StepCache.
func (s *DirStepCache) Has(ctx context.Context, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	_, err := os.Lstat(filepath.Join(s.snapDir(), key))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Prepare implements StepCache. It costs a copy of the parent tree.
func (s *DirStepCache) Prepare(ctx context.Context, parent string) (string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dir, err := os.MkdirTemp(s.workDir(), "step-")
	if err != nil {
		return "", fmt.Errorf("creating build work directory: %w", err)
	}
	if parent == "" {
		if err := os.Chmod(dir, 0o755); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		return dir, nil
	}
	if err := checkKey(parent); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	src := filepath.Join(s.snapDir(), parent)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(dir)
		return "", fmt.Errorf("snapshot %s: %w", parent, errdefs.ErrNotFound)
	}
	if err := copyTree(ctx, src, dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("copying snapshot %s: %w", parent, err)
	}
	return dir, nil
}

// Commit implements StepCache.
func (s *DirStepCache) Commit(ctx context.Context, dir, key string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.checkWork(dir); err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		os.RemoveAll(dir)
		return err
	}
	err := os.Rename(dir, filepath.Join(s.snapDir(), key))
	if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
		// Another build committed the same key first.
		return os.RemoveAll(dir)
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("committing snapshot %s: %w", key, err)
	}
	return nil
}

// Abort implements StepCache.
func (s *DirStepCache) Abort(ctx context.Context, dir string) error {
	if err := s.checkWork(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// checkWork refuses directories that Prepare did not make.
func (s *DirStepCache) checkWork(dir string) error {
	if filepath.Dir(dir) != s.workDir() {
		return fmt.Errorf("%s is not a prepared build directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Export implements StepCache. It costs a copy of the tree.
func (s *DirStepCache) Export(ctx context.Context, key, dir string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := checkKey(key); err != nil {
		return err
	}
	src := filepath.Join(s.snapDir(), key)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot %s: %w", key, errdefs.ErrNotFound)
	}
	if err := copyTree(ctx, src, dir); err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", key, err)
	}
	return nil
}

// Keys lists the committed snapshots.
func (s *DirStepCache) Keys(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(s.snapDir())
	if err != nil {
		return nil, fmt.Errorf("listing build snapshots: %w", err)
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// GC removes every committed snapshot whose key is not in keep and every
// prepared tree, and returns how many snapshots it removed. It waits for
// running operations and blocks new ones; run it when no build is in
// progress, or a build loses its prepared tree.
func (s *DirStepCache) GC(ctx context.Context, keep map[string]bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.Keys(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if keep[k] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.snapDir(), k)); err != nil {
			return n, fmt.Errorf("removing build snapshot %s: %w", k, err)
		}
		n++
	}
	work, err := os.ReadDir(s.workDir())
	if err != nil {
		return n, err
	}
	for _, e := range work {
		if err := os.RemoveAll(filepath.Join(s.workDir(), e.Name())); err != nil {
			return n, fmt.Errorf("removing build work directory %s: %w", e.Name(), err)
		}
	}
	return n, nil
}
