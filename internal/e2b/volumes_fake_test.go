package e2b

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// fakeVolumes is a VolumeManager whose volumes are directories under dir,
// reached through os.Root so that no path leaves its volume. inUse marks
// a volume as mounted by a sandbox.
type fakeVolumes struct {
	dir string

	mu    sync.Mutex
	vols  map[string]Volume
	inUse map[string][]string
}

var _ VolumeManager = (*fakeVolumes)(nil)

func newFakeVolumes(dir string) *fakeVolumes {
	return &fakeVolumes{dir: dir, vols: map[string]Volume{}, inUse: map[string][]string{}}
}

// setInUse marks volume name as mounted by sandboxes ids (none: unused).
func (f *fakeVolumes) setInUse(name string, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inUse[name] = ids
}

var fakeVolumeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func (f *fakeVolumes) CreateVolume(_ context.Context, o VolumeOptions) (Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !fakeVolumeName.MatchString(o.Name) {
		return Volume{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid volume name %q", o.Name)
	}
	if _, ok := f.vols[o.Name]; ok {
		return Volume{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "volume %q already exists", o.Name)
	}
	if err := os.Mkdir(filepath.Join(f.dir, o.Name), 0o755); err != nil {
		return Volume{}, err
	}
	v := Volume{Name: o.Name, SizeBytes: o.SizeBytes, Labels: o.Labels, CreatedAt: time.Now()}
	f.vols[o.Name] = v
	return v, nil
}

func (f *fakeVolumes) Volume(_ context.Context, name string) (Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vols[name]
	if !ok {
		return Volume{}, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	v.InUseBy = f.inUse[name]
	return v, nil
}

func (f *fakeVolumes) Volumes(ctx context.Context) ([]Volume, error) {
	f.mu.Lock()
	names := make([]string, 0, len(f.vols))
	for n := range f.vols {
		names = append(names, n)
	}
	f.mu.Unlock()
	slices.Sort(names)
	var out []Volume
	for _, n := range names {
		v, err := f.Volume(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (f *fakeVolumes) DeleteVolume(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.vols[name]; !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	if ids := f.inUse[name]; len(ids) > 0 {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %q is in use by %s", name, strings.Join(ids, ", "))
	}
	delete(f.vols, name)
	return os.RemoveAll(filepath.Join(f.dir, name))
}

// root opens volume name; rel is p relative to it.
func (f *fakeVolumes) root(name, p string) (root *os.Root, rel string, err error) {
	if _, err := f.Volume(context.Background(), name); err != nil {
		return nil, "", err
	}
	root, err = os.OpenRoot(filepath.Join(f.dir, name))
	if err != nil {
		return nil, "", err
	}
	rel = strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	return root, rel, nil
}

// kindOf gives an os error its errdefs kind.
func kindOf(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.Errorf(errdefs.ErrNotFound, "%v", err)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "%v", err)
	}
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "%v", err)
}

func fakeInfo(p string, fi fs.FileInfo) wire.FileInfo {
	t := wire.FileTypeOther
	switch {
	case fi.Mode().IsRegular():
		t = wire.FileTypeFile
	case fi.IsDir():
		t = wire.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		t = wire.FileTypeSymlink
	}
	return wire.FileInfo{Name: path.Base(p), Path: p, Type: t, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime()}
}

func (f *fakeVolumes) VolumeStat(_ context.Context, name, p string) (wire.FileInfo, error) {
	root, rel, err := f.root(name, p)
	if err != nil {
		return wire.FileInfo{}, err
	}
	defer root.Close()
	fi, err := root.Lstat(rel)
	if err != nil {
		return wire.FileInfo{}, kindOf(err)
	}
	return fakeInfo(path.Clean("/"+p), fi), nil
}

func (f *fakeVolumes) VolumeList(_ context.Context, name, p string) ([]wire.FileInfo, error) {
	root, rel, err := f.root(name, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	d, err := root.Open(rel)
	if err != nil {
		return nil, kindOf(err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, kindOf(err)
	}
	var out []wire.FileInfo
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, kindOf(err)
		}
		out = append(out, fakeInfo(path.Join("/", p, e.Name()), fi))
	}
	return out, nil
}

func (f *fakeVolumes) VolumeReadFile(_ context.Context, name, p string) (io.ReadCloser, int64, error) {
	root, rel, err := f.root(name, p)
	if err != nil {
		return nil, 0, err
	}
	defer root.Close()
	file, err := root.Open(rel)
	if err != nil {
		return nil, 0, kindOf(err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, 0, kindOf(err)
	}
	return file, fi.Size(), nil
}

func (f *fakeVolumes) VolumeWriteFile(_ context.Context, name, p string, r io.Reader, mode fs.FileMode) error {
	root, rel, err := f.root(name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return kindOf(err)
	}
	file, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return kindOf(err)
	}
	if _, err := io.Copy(file, r); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}

func (f *fakeVolumes) VolumeMkdir(_ context.Context, name, p string, parents bool, mode fs.FileMode) error {
	root, rel, err := f.root(name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if parents {
		return kindOf(root.MkdirAll(rel, mode))
	}
	return kindOf(root.Mkdir(rel, mode))
}

func (f *fakeVolumes) VolumeRemove(_ context.Context, name, p string) error {
	root, rel, err := f.root(name, p)
	if err != nil {
		return err
	}
	defer root.Close()
	return kindOf(root.RemoveAll(rel))
}
