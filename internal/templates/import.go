package templates

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/untar"
)

// ImportOptions tune Import of an image archive.
type ImportOptions struct {
	// Platform picks the image of a multi-platform archive; empty means
	// ociimage.DefaultPlatform.
	Platform string
	// Progress, if not nil, receives progress reports.
	Progress func(ociimage.Progress)
	// Service, if set, is the template's service (an image's own CMD and
	// ENTRYPOINT never start by themselves).
	Service *sandbox.Service
}

// Import makes template name from the archive read from r, which is
// either an image (an OCI image layout in a tar, what `docker save` writes
// since Docker 25 and `skopeo copy oci-archive:`; or a classic `docker
// save` archive) or a root file system tarball, plain or gzip-compressed.
// It tells them apart by the archive's top-level names: an image has an
// "oci-layout" or a "manifest.json" file there, a root file system has
// neither.
//
// An image is loaded into the image cache (verified against its digests)
// and unpacked like a pulled one, its configuration becoming the
// template's defaults; its Source is "import". A root file system is
// extracted as untar.ExtractTar does. Either way no entry can land
// outside the template's tree.
//
// Cost: the archive is first copied to a temporary file (an image must be
// read more than once), then read once more to tell its kind.
func (s *Service) Import(ctx context.Context, name string, r io.Reader, opts ImportOptions) (sandbox.Template, error) {
	if err := s.CheckName(name); err != nil {
		return sandbox.Template{}, err
	}
	if err := checkService(opts.Service, false); err != nil {
		return sandbox.Template{}, err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return sandbox.Template{}, err
	}
	defer end()
	began := time.Now()
	f, err := os.CreateTemp(s.tmpDir(), "upload-*")
	if err != nil {
		return sandbox.Template{}, fmt.Errorf("creating temporary file for the archive: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := copyContext(ctx, f, r); err != nil {
		return sandbox.Template{}, fmt.Errorf("receiving the archive: %w", err)
	}
	isImage, err := isImageArchive(f)
	if err != nil {
		return sandbox.Template{}, err
	}
	if !isImage {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return sandbox.Template{}, err
		}
		t, err := s.m.CreateTemplateFrom(ctx, sandbox.Template{Name: name, Source: "import", Service: opts.Service}, func(dir string) error {
			return untar.ExtractTar(ctx, f, dir)
		})
		if err != nil {
			return sandbox.Template{}, err
		}
		s.log.Info("template imported", "template", name, "kind", "rootfs", "duration_ms", time.Since(began).Milliseconds())
		return t, nil
	}
	img, err := s.cache.Load(ctx, f.Name(), ociimage.LoadOptions{Platform: opts.Platform, Progress: opts.Progress})
	if err != nil {
		return sandbox.Template{}, err
	}
	// The archive's path means nothing once it is gone: no Image ref.
	t, err := s.makeTemplate(ctx, sandbox.Template{Name: name, Source: "import", Service: opts.Service}, img, io.Discard)
	if err != nil {
		return sandbox.Template{}, err
	}
	s.log.Info("template imported", "template", name, "kind", "image", "digest", img.Digest.String(),
		"duration_ms", time.Since(began).Milliseconds())
	return t, nil
}

// copyContext copies r to w, stopping when ctx is canceled.
func copyContext(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// isImageArchive reports whether the tar archive in f, plain or gzip, is
// an image: it has "oci-layout" (required by the OCI image layout spec) or
// "manifest.json" (a `docker save` archive) at its top. Archives in other
// compressions are not images here; ExtractTar refuses them with a clear
// error. It reads the whole archive (contents skipped where f seeks).
func isImageArchive(f *os.File) (bool, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	br := bufio.NewReaderSize(f, 64<<10)
	var r io.Reader = br
	if head, _ := br.Peek(2); bytes.Equal(head, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return false, fmt.Errorf("reading gzip header: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		defer zr.Close()
		r = zr
	} else if _, err := f.Seek(0, io.SeekStart); err == nil {
		// Uncompressed: let the tar reader seek over contents.
		r = f
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) {
				return false, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading the archive: %v", err)
			}
			return false, fmt.Errorf("reading the archive: %w", err)
		}
		switch path.Clean(strings.TrimLeft(hdr.Name, "/")) {
		case "oci-layout", "manifest.json":
			if hdr.Typeflag == tar.TypeReg {
				return true, nil
			}
		}
	}
}
