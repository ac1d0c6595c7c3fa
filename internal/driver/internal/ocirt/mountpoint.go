package ocirt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
)

// MakeMountPoints creates in the template tree dir the empty files and
// directories that the given bind mount destinations need, so that
// starting a sandbox writes nothing into its copy-on-write root. Each
// entry it makes gets the owner of the directory it is made in: the
// result is the same whether a preparer that shifts owners (runc with
// user namespaces) ran before or after. Existing entries are left alone.
// It never follows symlinks out of dir.
func MakeMountPoints(dir string, files, dirs []string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening template tree: %w", err)
	}
	defer root.Close()
	for _, f := range files {
		if err := makeMountPoint(root, strings.TrimPrefix(f, "/"), false); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		if err := makeMountPoint(root, strings.TrimPrefix(d, "/"), true); err != nil {
			return err
		}
	}
	return nil
}

// makeMountPoint makes rel (and its missing parents) in root.
func makeMountPoint(root *os.Root, rel string, isDir bool) error {
	parent := path.Dir(rel)
	if parent != "." {
		if err := makeMountPoint(root, parent, true); err != nil {
			return err
		}
	}
	if _, err := root.Lstat(rel); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checking mount point /%s: %w", rel, err)
	}
	if isDir {
		err := root.Mkdir(rel, 0o755)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating mount point /%s: %w", rel, err)
		}
	} else {
		f, err := root.OpenFile(rel, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			return fmt.Errorf("creating mount point /%s: %w", rel, err)
		}
		f.Close()
	}
	fi, err := root.Lstat(parent)
	if err != nil {
		return fmt.Errorf("checking owner of /%s: %w", parent, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("checking owner of /%s: no owner", parent)
	}
	if err := root.Lchown(rel, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("setting owner of mount point /%s: %w", rel, err)
	}
	return nil
}
