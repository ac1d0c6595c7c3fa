package ociimage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/untar"
)

// Image is an image whose manifest, config and layers are all in a Cache.
// It is immutable; its methods are safe for concurrent use.
type Image struct {
	// Ref is where the image came from (a reference or a file path), for
	// messages and records.
	Ref string
	// Digest is the digest of the image manifest. For a `docker save`
	// archive, which has no manifest of its own, it is the digest of the
	// manifest Load wrote for it.
	Digest v1.Hash
	// Manifest lists the config and the layers, bottom layer first.
	Manifest *v1.Manifest
	// Config is the image configuration.
	Config *v1.ConfigFile

	cache *Cache
}

// Defaults are what an image says about how to run things in it. A
// template keeps the Defaults of the image it came from, and execs in its
// sandboxes start from them: Env is the base environment (the exec's own
// variables override it by name), WorkingDir the default working
// directory and User the default user. Entrypoint, Cmd and Labels are kept
// for callers that want them; sandboxes do not run them by themselves.
type Defaults struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Defaults returns a copy of the image's run settings.
func (img *Image) Defaults() Defaults {
	c := img.Config.Config
	return Defaults{
		Env:        slices.Clone(c.Env),
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
		Labels:     maps.Clone(c.Labels),
	}
}

// Blobs lists the digests of every blob of the image (manifest, config,
// layers), for the keep set of Cache.GC.
func (img *Image) Blobs() []v1.Hash {
	out := []v1.Hash{img.Digest, img.Manifest.Config.Digest}
	for _, l := range img.Manifest.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// MergeEnv returns base with the variables of over ("NAME=value") set on
// top: a name in both keeps its position in base and takes over's value,
// new names follow in over's order. It is how Defaults.Env and an exec's
// environment combine.
func MergeEnv(base, over []string) []string {
	out := slices.Clone(base)
	index := make(map[string]int, len(out))
	for i, kv := range out {
		index[envName(kv)] = i
	}
	for _, kv := range over {
		if i, ok := index[envName(kv)]; ok {
			out[i] = kv
			continue
		}
		index[envName(kv)] = len(out)
		out = append(out, kv)
	}
	return out
}

func envName(kv string) string {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i]
		}
	}
	return kv
}

// Unpack applies the image's layers in order into dir, creating dir if it
// does not exist, the way a container runtime would see them stacked:
// OCI whiteouts delete what lower layers left (".wh.<name>" deletes name,
// ".wh..wh..opq" empties its directory of lower content).
//
// Path safety: every write goes through an os.Root on dir, so no entry of
// any layer can create, change or remove anything outside dir. Names that
// climb above the root ("../x"), paths through absolute symlinks or
// symlinks that lead out, and hard links to outside are refused, and the
// whole image with them: an error names the layer's digest and the entry
// and wraps errdefs.ErrInvalidArgument, for example
// `applying layer 2/3 sha256:…: entry "etc/../../x": path escapes the rootfs: invalid argument`.
// Symlink targets are stored as they are; they resolve inside the sandbox.
//
// Regular files, directories, symlinks and hard links are created; device
// nodes and FIFOs are skipped (the runtime provides /dev); ownership is
// applied when running as root; extended attributes (file capabilities)
// are not applied.
//
// Cost: layers are streamed from the cache through the decompressor (gzip
// or zstd) into the tree with a 128 KiB buffer; nothing is held in memory
// but one path per entry of the current layer, for whiteouts. Each layer's
// digest is checked as it is read; on any error dir holds a partial tree
// that the caller removes (a storage backend's CreateTemplate does).
// Concurrent calls on different dirs are safe.
func (img *Image) Unpack(ctx context.Context, dir string) error {
	img.cache.mu.RLock()
	defer img.cache.mu.RUnlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating rootfs directory: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening rootfs directory: %w", err)
	}
	defer root.Close()
	buf := make([]byte, 128<<10)
	n := len(img.Manifest.Layers)
	for i, l := range img.Manifest.Layers {
		if err := img.cache.applyBlob(ctx, root, l, buf); err != nil {
			return fmt.Errorf("applying layer %d/%d %s of %s: %w", i+1, n, l.Digest, img.Ref, err)
		}
	}
	return nil
}

// applyBlob applies one cached layer blob onto root and checks its digest.
func (c *Cache) applyBlob(ctx context.Context, root *os.Root, l v1.Descriptor, buf []byte) error {
	if err := checkLayerType(l.MediaType); err != nil {
		return err
	}
	br, err := c.open(l.Digest)
	if err != nil {
		return err
	}
	defer br.Close()
	// partial decompresses what the first bytes say: gzip, zstd or none.
	layer, err := partial.CompressedToLayer(&cachedLayer{desc: l, r: br})
	if err != nil {
		return err
	}
	rc, err := layer.Uncompressed()
	if err != nil {
		return fmt.Errorf("reading layer: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	defer rc.Close()
	err = applyLayer(ctx, root, rc, buf)
	if err == nil {
		// Read the layer to its end: the gzip checksum comes last.
		if _, err = io.CopyBuffer(io.Discard, rc, buf); err != nil {
			err = fmt.Errorf("reading the end of the layer: %w", untar.StreamError(err))
		}
	}
	if err != nil && ctx.Err() != nil {
		return err
	}
	// Read the blob to its end, even after an error: its digest is checked
	// there, and a corrupt cached blob explains (and replaces) whatever
	// error its contents caused.
	if _, verr := io.CopyBuffer(io.Discard, br, buf); verr != nil {
		return verr
	}
	return err
}

// checkLayerType refuses layer media types that are not plain filesystem
// changesets.
func checkLayerType(mt types.MediaType) error {
	switch mt {
	case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return fmt.Errorf("non-distributable (foreign) layers are not supported: %w", errdefs.ErrNotImplemented)
	case "", types.DockerLayer, types.DockerUncompressedLayer, types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer:
		return nil
	}
	return fmt.Errorf("layer media type %q is not supported: %w", mt, errdefs.ErrNotImplemented)
}

// cachedLayer hands an open cached blob to partial.CompressedToLayer.
type cachedLayer struct {
	desc v1.Descriptor
	r    io.ReadCloser
}

func (l *cachedLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *cachedLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *cachedLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *cachedLayer) Compressed() (io.ReadCloser, error)  { return io.NopCloser(l.r), nil }

// Image opens an image whose manifest is in the cache by the manifest's
// digest, without any network: the builder and callers that recorded an
// image's digest use it. Missing blobs return an error wrapping
// errdefs.ErrNotFound.
func (c *Cache) Image(ctx context.Context, digest v1.Hash) (*Image, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.image(ctx, digest.String(), digest)
}

// image builds an Image from cached blobs; ref names it in messages. The
// caller holds c.mu.
func (c *Cache) image(ctx context.Context, ref string, digest v1.Hash) (*Image, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	raw, err := c.readBlob(digest, maxManifestBytes)
	if err != nil {
		return nil, fmt.Errorf("reading manifest of %s: %w", ref, err)
	}
	m, err := parseManifest(raw)
	if err != nil {
		return nil, fmt.Errorf("reading manifest of %s: %w", ref, err)
	}
	rawCfg, err := c.readBlob(m.Config.Digest, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("reading config of %s: %w", ref, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return nil, fmt.Errorf("parsing config of %s: %w: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	for _, l := range m.Layers {
		if !c.Has(l.Digest) {
			return nil, fmt.Errorf("layer %s of %s is not in the image cache: %w", l.Digest, ref, errdefs.ErrNotFound)
		}
	}
	return &Image{Ref: ref, Digest: digest, Manifest: m, Config: cfg, cache: c}, nil
}

// parseManifest parses an image manifest and checks the digests it names.
func parseManifest(raw []byte) (*v1.Manifest, error) {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parsing image manifest: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if m.MediaType != "" && !m.MediaType.IsImage() {
		return nil, fmt.Errorf("manifest media type %q is not an image manifest: %w", m.MediaType, errdefs.ErrInvalidArgument)
	}
	if err := checkDigest(m.Config.Digest); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for i, l := range m.Layers {
		if err := checkDigest(l.Digest); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i+1, err)
		}
		if err := checkLayerType(l.MediaType); err != nil {
			return nil, fmt.Errorf("layer %d %s: %w", i+1, l.Digest, err)
		}
	}
	return m, nil
}
