package mounts

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

var _ sandbox.ChangeLister = (*Mounter)(nil)

// Changes implements sandbox.ChangeLister: it reads the copy-on-write
// layer of mount i of sandbox id. An entry there is a deletion when it is
// a whiteout (a 0/0 character device), an addition when the host
// directory has nothing at its path, and a modification otherwise; a
// directory that exists on both sides is not a change of its own.
func (m *Mounter) Changes(id string, i int, target string) ([]sandbox.Change, error) {
	if !driver.ValidID(id) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sandbox id %q", id)
	}
	upper := filepath.Join(m.cfg.StateDir, id, strconv.Itoa(i), "upper")
	lower := filepath.Join(m.cfg.RunDir, id, strconv.Itoa(i), "src")
	if _, err := os.Lstat(upper); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s has no copy-on-write layer for %s", id, target)
	}
	// The host directory is looked at through an os.Root: a symlink there
	// must not lead the check outside it.
	lr, err := os.OpenRoot(lower)
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	var out []sandbox.Change
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == upper {
			return nil
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		c := sandbox.Change{Path: path.Join(target, filepath.ToSlash(rel))}
		_, lerr := lr.Lstat(rel)
		inLower := lerr == nil
		switch {
		case isWhiteout(d, p):
			c.Kind = sandbox.ChangeDeleted
		case !inLower:
			c.Kind = sandbox.ChangeAdded
		case d.IsDir() && !opaque(p):
			return nil
		default:
			c.Kind = sandbox.ChangeModified
		}
		out = append(out, c)
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Path < out[b].Path })
	return out, nil
}

// isWhiteout reports whether the upper entry at p marks a deletion.
func isWhiteout(d fs.DirEntry, p string) bool {
	if d.Type()&fs.ModeCharDevice == 0 {
		return false
	}
	fi, err := d.Info()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// opaque reports whether the upper directory p replaced the host
// directory at its path (it was deleted and made again).
func opaque(p string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}
