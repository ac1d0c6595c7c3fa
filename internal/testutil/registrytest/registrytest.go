// Package registrytest serves an in-process OCI registry on 127.0.0.1
// and makes the images tests push to it: layers of hand-made trees, and
// an image of the busybox root file system that Corral's own busybox
// templates hold.
package registrytest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corralrun/corral/internal/rootfs"
)

// Registry is an in-process registry on 127.0.0.1; Host is its
// host:port.
type Registry struct{ Host string }

// Start serves a registry until the end of t.
func Start(t testing.TB) *Registry {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return &Registry{Host: strings.TrimPrefix(srv.URL, "http://")}
}

// Push uploads img as repo:tag and returns its reference.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.Host + "/" + repoTag
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// Layer is a layer of the tar stream b.
func Layer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// DirLayer makes a layer of the tree at dir, with owners, modes and
// symlinks as they are.
func DirLayer(t testing.TB, dir string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = filepath.ToSlash(rel)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return Layer(t, buf.Bytes())
}

// BusyboxLayer is a layer holding the busybox root file system of
// Corral's busybox templates.
func BusyboxLayer(t testing.TB) v1.Layer {
	t.Helper()
	dir := t.TempDir()
	if err := rootfs.FillBusybox(dir, ""); err != nil {
		t.Fatal(err)
	}
	return DirLayer(t, dir)
}

// Image is a linux/amd64 image of layers with the run settings cfg.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config, cf.OS, cf.Architecture = cfg, "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
