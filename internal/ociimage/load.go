package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/untar"
)

// LoadOptions tune Load.
type LoadOptions struct {
	// Platform picks the image of a multi-platform index, as in
	// PullOptions.
	Platform string
	// Ref picks one image of a source that holds several: a tag of a
	// `docker save` archive ("python:3.12"), or the
	// "org.opencontainers.image.ref.name" or "io.containerd.image.name"
	// annotation of an OCI layout's index. Empty is fine when the source
	// holds one image.
	Ref string
	// Progress, if not nil, receives progress reports.
	Progress func(Progress)
}

// Annotations of index entries that name an image.
const (
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// Load reads an image from a local file or directory into the cache and
// returns it. path may be an OCI image layout directory, a tar archive of
// one (what `docker save` writes since Docker 25, and `skopeo copy
// oci-archive:`), or a classic `docker save` archive (manifest.json and
// layer tarballs); archives may be gzip-compressed.
//
// Everything is verified before it is kept: in an OCI layout every blob
// must hash to the digest it is referenced by (a changed layer or config is
// refused with errdefs.ErrInvalidArgument); in a `docker save` archive,
// which has no manifest digests, each layer must hash to the
// rootfs.diff_ids of the image config, and the config to the digest in its
// file name when it has one. Layers of `docker save` archives are kept
// uncompressed, as they come. A missing path returns an error wrapping
// errdefs.ErrNotFound, anything that is not an image ErrInvalidArgument.
//
// Cost: a scan of the archive's headers and one sequential read of it for
// an OCI archive; a `docker save` archive's headers are scanned once more
// per layer (with seeks over the contents).
func (c *Cache) Load(ctx context.Context, path string, opts LoadOptions) (*Image, error) {
	img, err := c.load(ctx, path, opts)
	if err != nil {
		return nil, fmt.Errorf("loading image from %s: %w", path, err)
	}
	return img, nil
}

func (c *Cache) load(ctx context.Context, p string, opts LoadOptions) (*Image, error) {
	platform, err := parsePlatform(opts.Platform)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if fi.IsDir() {
		return c.loadLayout(ctx, p, platform, opts)
	}
	plain, cleanup, err := c.decompressed(ctx, p)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	open := opener(plain)
	kind, err := archiveKind(open)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "oci":
		return c.loadOCIArchive(ctx, p, open, platform, opts)
	case "docker":
		return c.loadDockerArchive(ctx, p, open, opts)
	}
	return nil, fmt.Errorf("not an image: neither an OCI layout (index.json) nor a docker save archive (manifest.json): %w", errdefs.ErrInvalidArgument)
}

// decompressed returns the path of the plain tar archive at p: p itself,
// or, when p is gzip-compressed, a temporary decompressed copy in the
// cache, so that the archive is decompressed once however many times it
// is read. The caller calls cleanup.
func (c *Cache) decompressed(ctx context.Context, p string) (plain string, cleanup func(), err error) {
	f, err := os.Open(p)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	if head, _ := br.Peek(2); !bytes.Equal(head, []byte{0x1f, 0x8b}) {
		return p, func() {}, nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return "", nil, fmt.Errorf("reading gzip header: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	tmp, err := os.CreateTemp(c.tmpDir(), "archive-*.tar")
	if err != nil {
		return "", nil, fmt.Errorf("creating temporary file: %w", err)
	}
	cleanup = func() { os.Remove(tmp.Name()) }
	_, err = copyCounting(ctx, tmp, zr, nil)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("decompressing: %w", untar.StreamError(err))
	}
	return tmp.Name(), cleanup, nil
}

// opener opens the archive at p; the tar reader seeks over the contents
// it skips.
func opener(p string) tarball.Opener {
	return func() (io.ReadCloser, error) { return os.Open(p) }
}

// archiveKind scans the archive's names: "oci" when it holds index.json,
// "docker" when it holds manifest.json only, "" otherwise. Docker 25 and
// later write both; the OCI layout is preferred because its blobs are
// addressed by digest.
func archiveKind(open tarball.Opener) (string, error) {
	rc, err := open()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	kind := ""
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kind, nil
		}
		if err != nil {
			return "", fmt.Errorf("reading archive: %w", untar.StreamError(err))
		}
		switch path.Clean(strings.TrimLeft(hdr.Name, "/")) {
		case "index.json":
			return "oci", nil
		case "manifest.json":
			kind = "docker"
		}
	}
}

// blobSource opens the blobs of an image source by digest.
type blobSource func(v1.Hash) (io.ReadCloser, error)

func (c *Cache) loadLayout(ctx context.Context, dir string, platform v1.Platform, opts LoadOptions) (*Image, error) {
	index, err := readFileLimit(filepath.Join(dir, "index.json"), maxManifestBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("directory is not an OCI image layout (no index.json): %w", errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, err
	}
	lp := layout.Path(dir)
	open := func(d v1.Hash) (io.ReadCloser, error) {
		if err := checkDigest(d); err != nil {
			return nil, err
		}
		rc, err := lp.Blob(d)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("blob %s is missing from the layout: %w", d, errdefs.ErrInvalidArgument)
		}
		return rc, err
	}
	return c.importOCI(ctx, dir, index, open, platform, opts)
}

// loadOCIArchive copies every blob of the archive into the cache in one
// pass, each verified against the digest its name claims, then imports
// the image from the cache.
func (c *Cache) loadOCIArchive(ctx context.Context, ref string, open tarball.Opener, platform v1.Platform, opts LoadOptions) (*Image, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var index []byte
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading archive: %w", untar.StreamError(err))
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		n := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		if n == "index.json" {
			if index, err = readLimit(tr, maxManifestBytes); err != nil {
				return nil, fmt.Errorf("reading index.json: %w", err)
			}
			continue
		}
		hexDigest, ok := strings.CutPrefix(n, "blobs/sha256/")
		if !ok {
			continue
		}
		d := v1.Hash{Algorithm: "sha256", Hex: hexDigest}
		if err := checkDigest(d); err != nil {
			return nil, fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		rep := newReporter(opts.Progress, "loading blob", d.String(), hdr.Size)
		if c.Has(d) {
			rep.cached()
			continue
		}
		rep.start()
		got, err := c.put(ctx, d, hdr.Size, tr, rep.update)
		if err != nil {
			return nil, fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		rep.done(got)
	}
	open2 := func(d v1.Hash) (io.ReadCloser, error) {
		r, err := c.open(d)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("blob %s is missing from the archive: %w", d, errdefs.ErrInvalidArgument)
		}
		return r, err
	}
	return c.importOCI(ctx, ref, index, open2, platform, opts)
}

// importOCI resolves the image of an OCI index, copies the blobs it needs
// from open into the cache, verified, and returns it.
func (c *Cache) importOCI(ctx context.Context, ref string, index []byte, open blobSource, platform v1.Platform, opts LoadOptions) (*Image, error) {
	if index == nil {
		return nil, fmt.Errorf("no index.json: %w", errdefs.ErrInvalidArgument)
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(index))
	if err != nil {
		return nil, fmt.Errorf("parsing index.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	desc, raw, err := chooseManifest(im, open, platform, opts.Ref, 0)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(raw)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	if err := c.copyBlob(ctx, open, m.Config, nil); err != nil {
		return nil, fmt.Errorf("config %s: %w", m.Config.Digest, err)
	}
	for i, l := range m.Layers {
		rep := newReporter(opts.Progress, "loading layer", l.Digest.String(), l.Size)
		if err := c.copyBlob(ctx, open, l, rep); err != nil {
			return nil, fmt.Errorf("layer %d/%d %s: %w", i+1, len(m.Layers), l.Digest, err)
		}
	}
	if err := c.putBytes(ctx, desc.Digest, raw); err != nil {
		return nil, fmt.Errorf("storing manifest: %w", err)
	}
	return c.image(ctx, ref, desc.Digest)
}

// copyBlob copies the blob d describes from open into the cache, verified,
// unless it is there already.
func (c *Cache) copyBlob(ctx context.Context, open blobSource, d v1.Descriptor, rep *reporter) error {
	if c.Has(d.Digest) {
		rep.cached()
		return nil
	}
	rc, err := open(d.Digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	rep.start()
	n, err := c.put(ctx, d.Digest, d.Size, rc, rep.update)
	if err != nil {
		return err
	}
	rep.done(n)
	return nil
}

// chooseManifest finds the image manifest in an index for platform and
// returns its descriptor and verified bytes. want, if set, must match a
// name annotation of a top-level entry. An entry without a platform is
// taken when it is the only image on its level.
func chooseManifest(im *v1.IndexManifest, open blobSource, platform v1.Platform, want string, depth int) (v1.Descriptor, []byte, error) {
	if depth == maxIndexDepth {
		return v1.Descriptor{}, nil, fmt.Errorf("image indexes nest deeper than %d levels: %w", maxIndexDepth, errdefs.ErrInvalidArgument)
	}
	var matched, unplatformed []v1.Descriptor
	var have []string
	for _, d := range im.Manifests {
		if depth == 0 && want != "" && d.Annotations[annotationRefName] != want && d.Annotations[annotationContainerdName] != want {
			continue
		}
		switch {
		case d.MediaType.IsIndex():
			raw, err := readVerified(open, d, maxManifestBytes)
			if err != nil {
				return v1.Descriptor{}, nil, fmt.Errorf("index %s: %w", d.Digest, err)
			}
			sub, err := v1.ParseIndexManifest(bytes.NewReader(raw))
			if err != nil {
				return v1.Descriptor{}, nil, fmt.Errorf("parsing index %s: %w: %w", d.Digest, err, errdefs.ErrInvalidArgument)
			}
			got, raw, err := chooseManifest(sub, open, platform, "", depth+1)
			if err == nil {
				return got, raw, nil
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				return v1.Descriptor{}, nil, err
			}
		case d.MediaType.IsImage():
			switch {
			case d.Platform == nil:
				unplatformed = append(unplatformed, d)
			case d.Platform.Satisfies(platform):
				matched = append(matched, d)
			default:
				have = append(have, d.Platform.String())
			}
		}
	}
	var pick v1.Descriptor
	switch {
	case len(matched) > 0:
		pick = matched[0]
	case len(unplatformed) == 1:
		pick = unplatformed[0]
	case len(unplatformed) > 1:
		return v1.Descriptor{}, nil, fmt.Errorf("the index holds %d images; choose one by reference: %w", len(unplatformed), errdefs.ErrInvalidArgument)
	case want != "" && depth == 0:
		return v1.Descriptor{}, nil, fmt.Errorf("no image named %q: %w", want, errdefs.ErrNotFound)
	default:
		return v1.Descriptor{}, nil, fmt.Errorf("no image for platform %s (found %s): %w", platform, listOrNone(have), errdefs.ErrNotFound)
	}
	raw, err := readVerified(open, pick, maxManifestBytes)
	if err != nil {
		return v1.Descriptor{}, nil, fmt.Errorf("manifest %s: %w", pick.Digest, err)
	}
	return pick, raw, nil
}

// readVerified reads the small blob d describes and checks its digest and
// size.
func readVerified(open blobSource, d v1.Descriptor, limit int64) ([]byte, error) {
	if err := checkDigest(d.Digest); err != nil {
		return nil, err
	}
	rc, err := open(d.Digest)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := readLimit(rc, limit)
	if err != nil {
		return nil, err
	}
	if d.Size > 0 && int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob does not match its descriptor (%d bytes, want %d): %w", len(b), d.Size, errdefs.ErrInvalidArgument)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != d.Digest.Hex {
		return nil, fmt.Errorf("blob does not match its digest %s: %w", d.Digest, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

func readLimit(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes: %w", limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

func readFileLimit(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimit(f, limit)
}

// loadDockerArchive imports a classic `docker save` archive. Its layers
// are stored uncompressed under their diff IDs, and a manifest is written
// for it so that it is an Image like any other.
func (c *Cache) loadDockerArchive(ctx context.Context, ref string, open tarball.Opener, opts LoadOptions) (*Image, error) {
	var tag *name.Tag
	if opts.Ref != "" {
		t, err := name.NewTag(opts.Ref)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		tag = &t
	}
	mf, err := tarball.LoadManifest(open)
	if err != nil {
		return nil, fmt.Errorf("reading manifest.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	entry, err := pickDockerEntry(mf, tag)
	if err != nil {
		return nil, err
	}
	timg, err := tarball.Image(open, tag)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	rawCfg, err := timg.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	cfgDigest, cfgSize, err := v1.SHA256(bytes.NewReader(rawCfg))
	if err != nil {
		return nil, err
	}
	if claimed, ok := digestFromName(entry.Config); ok && claimed != cfgDigest {
		return nil, fmt.Errorf("config %s does not match its digest (content hashes to %s): %w", entry.Config, cfgDigest, errdefs.ErrInvalidArgument)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return nil, fmt.Errorf("parsing config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(cfg.RootFS.DiffIDs) != len(entry.Layers) {
		return nil, fmt.Errorf("manifest.json lists %d layers, the config %d diff IDs: %w", len(entry.Layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.DockerManifestSchema2,
		Config:        v1.Descriptor{MediaType: types.DockerConfigJSON, Size: cfgSize, Digest: cfgDigest},
	}
	for i, diffID := range cfg.RootFS.DiffIDs {
		n, err := c.copyDockerLayer(ctx, timg, diffID, opts.Progress)
		if err != nil {
			return nil, fmt.Errorf("layer %d/%d %s: %w", i+1, len(cfg.RootFS.DiffIDs), entry.Layers[i], err)
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.DockerUncompressedLayer, Size: n, Digest: diffID})
	}
	if err := c.putBytes(ctx, cfgDigest, rawCfg); err != nil {
		return nil, fmt.Errorf("storing config: %w", err)
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	digest, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if err := c.putBytes(ctx, digest, raw); err != nil {
		return nil, fmt.Errorf("storing manifest: %w", err)
	}
	return c.image(ctx, ref, digest)
}

// copyDockerLayer stores the uncompressed layer diffID of a docker archive,
// verified against diffID, and returns its size.
func (c *Cache) copyDockerLayer(ctx context.Context, timg v1.Image, diffID v1.Hash, progress func(Progress)) (int64, error) {
	if err := checkDigest(diffID); err != nil {
		return 0, err
	}
	rep := newReporter(progress, "loading layer", diffID.String(), -1)
	if fi, err := os.Stat(c.blobPath(diffID)); err == nil {
		rep.cached()
		return fi.Size(), nil
	}
	l, err := timg.LayerByDiffID(diffID)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	defer rc.Close()
	rep.start()
	n, err := c.put(ctx, diffID, -1, rc, rep.update)
	if err != nil {
		return 0, err
	}
	rep.done(n)
	return n, nil
}

// pickDockerEntry finds the manifest.json entry that tarball.Image will
// use for tag.
func pickDockerEntry(mf tarball.Manifest, tag *name.Tag) (tarball.Descriptor, error) {
	if tag == nil {
		if len(mf) != 1 {
			return tarball.Descriptor{}, fmt.Errorf("the archive holds %d images; choose one by tag: %w", len(mf), errdefs.ErrInvalidArgument)
		}
		return mf[0], nil
	}
	for _, d := range mf {
		for _, t := range d.RepoTags {
			if pt, err := name.NewTag(t); err == nil && pt.String() == tag.String() {
				return d, nil
			}
		}
	}
	return tarball.Descriptor{}, fmt.Errorf("no image tagged %s in the archive: %w", tag, errdefs.ErrNotFound)
}

// digestFromName reads the digest that a `docker save` file name carries:
// "<hex>.json" (before Docker 25) or "blobs/sha256/<hex>".
func digestFromName(p string) (v1.Hash, bool) {
	base := strings.TrimSuffix(path.Base(p), ".json")
	h := v1.Hash{Algorithm: "sha256", Hex: base}
	if checkDigest(h) != nil {
		return v1.Hash{}, false
	}
	return h, true
}
