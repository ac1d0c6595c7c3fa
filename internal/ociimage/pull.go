package ociimage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/corralrun/corral/internal/errdefs"
)

// DefaultPlatform is the platform pulled and loaded when none is given.
const DefaultPlatform = "linux/amd64"

// pullJobs is how many layers download at once.
const pullJobs = 3

// PullOptions tune Pull.
type PullOptions struct {
	// Platform picks the image of a multi-platform index, as
	// "os/arch[/variant]"; empty means DefaultPlatform.
	Platform string
	// Keychain finds credentials for the registry; nil means
	// authn.DefaultKeychain, which reads the docker config file
	// ($DOCKER_CONFIG/config.json or ~/.docker/config.json, with its
	// credential helpers).
	Keychain authn.Keychain
	// Insecure allows plain HTTP to the registry. Loopback registries
	// (localhost, 127.0.0.1) use plain HTTP without it.
	Insecure bool
	// Transport, if not nil, carries the registry requests.
	Transport http.RoundTripper
	// Progress, if not nil, receives progress reports, from several
	// goroutines at once; ProgressPrinter.Update fits.
	Progress func(Progress)
}

func parsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		s = DefaultPlatform
	}
	p, err := v1.ParsePlatform(s)
	if err != nil {
		return v1.Platform{}, fmt.Errorf("platform %q: %w: %w", s, err, errdefs.ErrInvalidArgument)
	}
	return *p, nil
}

// Pull fetches the image ref ("python:3.12", "ghcr.io/o/i@sha256:…") from
// its registry into the cache and returns it. Only blobs missing from the
// cache are downloaded, up to three at a time, each verified against its
// digest before it is kept; a pull of an image whose blobs are all cached
// makes one manifest request (two for a multi-platform index) and no blob
// requests. Errors wrap errdefs.ErrInvalidArgument for a malformed
// reference or image, ErrNotFound for an unknown repository, tag or
// platform, ErrUnauthenticated and ErrPermissionDenied for refused
// credentials, ErrUnavailable when the registry cannot be reached.
// Canceling ctx stops the transfers; Pull returns once its goroutines
// have exited.
func (c *Cache) Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	img, err := c.pull(ctx, ref, opts)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	return img, nil
}

func (c *Cache) pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	platform, err := parsePlatform(opts.Platform)
	if err != nil {
		return nil, err
	}
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nameOpts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	remoteOpts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithPlatform(platform),
	}
	if opts.Transport != nil {
		remoteOpts = append(remoteOpts, remote.WithTransport(opts.Transport))
	}
	rimg, err := resolve(r, platform, remoteOpts)
	if err != nil {
		return nil, err
	}
	raw, err := rimg.RawManifest()
	if err != nil {
		return nil, registryError(err)
	}
	digest, err := rimg.Digest()
	if err != nil {
		return nil, registryError(err)
	}
	m, err := parseManifest(raw)
	if err != nil {
		return nil, err
	}

	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.Has(m.Config.Digest) {
		cfg, err := rimg.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("fetching config %s: %w", m.Config.Digest, registryError(err))
		}
		if err := c.putBytes(ctx, m.Config.Digest, cfg); err != nil {
			return nil, fmt.Errorf("storing config: %w", err)
		}
	}
	if err := c.fetchLayers(ctx, rimg, m.Layers, opts.Progress); err != nil {
		return nil, err
	}
	// The manifest goes in last: a cached manifest means a complete image.
	if err := c.putBytes(ctx, digest, raw); err != nil {
		return nil, fmt.Errorf("storing manifest: %w", err)
	}
	return c.image(ctx, r.String(), digest)
}

// resolve fetches the manifest of r, choosing the image for platform when
// r names an index.
func resolve(r name.Reference, platform v1.Platform, opts []remote.Option) (v1.Image, error) {
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, registryError(err)
	}
	for depth := 0; desc.MediaType.IsIndex(); depth++ {
		if depth == maxIndexDepth {
			return nil, fmt.Errorf("image indexes nest deeper than %d levels: %w", maxIndexDepth, errdefs.ErrInvalidArgument)
		}
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, registryError(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, registryError(err)
		}
		child, err := pickPlatform(im.Manifests, platform)
		if err != nil {
			return nil, err
		}
		if desc, err = remote.Get(r.Context().Digest(child.Digest.String()), opts...); err != nil {
			return nil, registryError(err)
		}
	}
	if desc.MediaType.IsSchema1() {
		return nil, fmt.Errorf("%s has a Docker schema 1 manifest, which is not supported: %w", r, errdefs.ErrNotImplemented)
	}
	if !desc.MediaType.IsImage() {
		return nil, fmt.Errorf("%s is a %s, not an image: %w", r, desc.MediaType, errdefs.ErrInvalidArgument)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryError(err)
	}
	return img, nil
}

// maxIndexDepth bounds how many indexes deep an image may sit.
const maxIndexDepth = 3

// pickPlatform returns the first entry of an index for platform. Entries
// without a platform are skipped: in an index they are attestations or
// other artifacts.
func pickPlatform(entries []v1.Descriptor, platform v1.Platform) (v1.Descriptor, error) {
	var have []string
	for _, d := range entries {
		if d.Platform == nil {
			continue
		}
		if d.Platform.Satisfies(platform) {
			return d, nil
		}
		have = append(have, d.Platform.String())
	}
	return v1.Descriptor{}, fmt.Errorf("no image for platform %s (the index has %s): %w", platform, listOrNone(have), errdefs.ErrNotFound)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// fetchLayers downloads the layers missing from the cache, pullJobs at a
// time; the first failure cancels the others.
func (c *Cache) fetchLayers(ctx context.Context, rimg v1.Image, layers []v1.Descriptor, progress func(Progress)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan v1.Descriptor)
	var wg sync.WaitGroup
	for range min(pullJobs, len(layers)) {
		wg.Go(func() {
			for l := range work {
				if err := c.fetchLayer(ctx, rimg, l, progress); err != nil {
					cancel(fmt.Errorf("fetching layer %s: %w", l.Digest, err))
				}
			}
		})
	}
	seen := make(map[v1.Hash]bool)
feed:
	for _, l := range layers {
		rep := newReporter(progress, "pulling layer", l.Digest.String(), l.Size)
		if seen[l.Digest] || c.Has(l.Digest) {
			if !seen[l.Digest] {
				rep.cached()
			}
			seen[l.Digest] = true
			continue
		}
		seen[l.Digest] = true
		select {
		case work <- l:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

func (c *Cache) fetchLayer(ctx context.Context, rimg v1.Image, l v1.Descriptor, progress func(Progress)) error {
	if err := checkLayerType(l.MediaType); err != nil {
		return err
	}
	layer, err := rimg.LayerByDigest(l.Digest)
	if err != nil {
		return registryError(err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return registryError(err)
	}
	defer rc.Close()
	rep := newReporter(progress, "pulling layer", l.Digest.String(), l.Size)
	rep.start()
	n, err := c.put(ctx, l.Digest, l.Size, rc, rep.update)
	if err != nil {
		return registryError(err)
	}
	rep.done(n)
	return nil
}

// registryError adds the errdefs kind that a registry failure means, if
// it has one and err does not already carry a kind.
func registryError(err error) error {
	if errdefs.Code(err) != errdefs.CodeInternal || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
			case transport.UnauthorizedErrorCode:
				return fmt.Errorf("%w: %w", err, errdefs.ErrUnauthenticated)
			case transport.DeniedErrorCode:
				return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
			}
		}
		switch {
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		case te.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("%w: %w", err, errdefs.ErrUnauthenticated)
		case te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
		}
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	return err
}
