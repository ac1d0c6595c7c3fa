package ociimage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/untar"
)

// Whiteout names, from the OCI image spec (image-layer, "Whiteouts"):
// "A whiteout file is an empty file with a special filename that signifies
// a path should be deleted. A whiteout filename consists of the prefix
// .wh. plus the basename of the path to be deleted." and "An opaque
// whiteout entry is a file with the name .wh..wh..opq indicating that all
// siblings are hidden in the lower layer."
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// applier applies one layer's tar stream onto a tree. All writes, removals
// and lookups go through root, so no entry can reach outside the tree,
// whatever the names, symlinks and hard links in this or earlier layers.
type applier struct {
	root *os.Root
	// w writes the layer's files, directories and links into root.
	w *untar.Writer
	// mine holds every path this layer has written, with its ancestors.
	// The spec says "Whiteout files MUST only apply to resources in
	// lower/parent layers. Files that are present in the same layer as a
	// whiteout file can only be hidden by whiteout files in subsequent
	// layers", and layers are not required to put whiteouts first, so a
	// whiteout or opaque marker removes only what this set does not hold.
	mine map[string]bool
}

// applyLayer applies the uncompressed layer tar read from r onto the tree
// opened as root: entries in order, later ones replacing earlier ones of
// the same name, whiteouts deleting what lower layers left. buf is the copy
// buffer. It reads r to the end of the tar stream. Errors name the entry
// and wrap errdefs.ErrInvalidArgument when the layer is at fault.
func applyLayer(ctx context.Context, root *os.Root, r io.Reader, buf []byte) error {
	a := &applier{root: root, w: untar.NewWriter(root, buf), mine: make(map[string]bool)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		// Our own name checks are stricter than tar.ErrInsecurePath, so a
		// header that comes with it is processed as usual.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("reading layer: %w", untar.StreamError(err))
		}
		if err := a.entry(ctx, hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	return a.w.Finish()
}

func (a *applier) entry(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error {
	name, err := untar.CleanName(hdr.Name)
	if err != nil {
		return err
	}
	if strings.HasPrefix(name, whiteoutMeta) {
		// AUFS keeps its bookkeeping (hard link directories) under
		// ".wh..wh.*" at the top; the spec reserves the prefix and it is
		// not part of the filesystem.
		return nil
	}
	if dir, base := path.Dir(name), path.Base(name); strings.HasPrefix(base, whiteoutPrefix) {
		return a.w.Classify(a.whiteout(dir, base), name)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		// A PAX global header holds records for later entries (which
		// archive/tar does not apply); it is no file of its own.
		return nil
	}
	wrote, err := a.w.Entry(ctx, hdr, tr)
	if wrote {
		a.mark(name)
	}
	return err
}

// mark records that this layer wrote name, and so its ancestors.
func (a *applier) mark(name string) {
	for name != "." && !a.mine[name] {
		a.mine[name] = true
		name = path.Dir(name)
	}
}

// whiteout handles an entry named dir/base where base starts with ".wh.".
func (a *applier) whiteout(dir, base string) error {
	switch {
	case base == whiteoutOpaque:
		return a.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta):
		// Other ".wh..wh." names are reserved and hide nothing.
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return fmt.Errorf("whiteout names no file: %w", errdefs.ErrInvalidArgument)
	}
	return a.removeLower(path.Join(dir, victim))
}

// opaque hides everything lower layers put in dir.
func (a *applier) opaque(dir string) error {
	fi, err := a.root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return a.removeLowerChildren(dir)
	}
	if a.mine[dir] {
		return fmt.Errorf("opaque marker inside %q, which this layer made a non-directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	// A lower non-directory stands where this layer has a directory: the
	// directory entry itself may come later in the stream.
	return a.root.RemoveAll(dir)
}

// removeLower deletes p as far as lower layers made it: entirely when this
// layer has not written p, otherwise only the lower parts of a directory.
func (a *applier) removeLower(p string) error {
	if !a.mine[p] {
		return a.root.RemoveAll(p)
	}
	fi, err := a.root.Lstat(p)
	if err != nil || !fi.IsDir() {
		return nil
	}
	return a.removeLowerChildren(p)
}

func (a *applier) removeLowerChildren(dir string) error {
	f, err := a.root.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := a.removeLower(path.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}
