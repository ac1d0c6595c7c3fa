package templates

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// Config wires a Service.
type Config struct {
	// Manager makes the templates and runs build steps.
	Manager *sandbox.Manager
	// CacheDir holds the image blob cache (ociimage.Cache).
	CacheDir string
	// BuildDir holds the build cache (ociimage.DirStepCache) and, while they
	// are in use, uploaded archives and build contexts under tmp/. On the
	// filesystem of the templates (btrfs.Backend.ScratchDir), copying a
	// build result into a template clones its extents.
	BuildDir string
	// Keychain finds registry credentials; nil means the docker config
	// file ($DOCKER_CONFIG/config.json or ~/.docker/config.json).
	Keychain authn.Keychain
	// Logger receives one line per pull, import, build and collection;
	// nil discards them.
	Logger *slog.Logger
}

// Service makes templates from images. It is safe for concurrent use;
// Close must be called when it is no longer needed.
type Service struct {
	cfg   Config
	m     *sandbox.Manager
	cache *ociimage.Cache
	snaps *ociimage.DirStepCache
	log   *slog.Logger

	// ops is held shared by every pull, import and build, and
	// exclusively by garbage collection (lockOps), which must not remove
	// a blob or a snapshot that an operation is about to use.
	ops sync.RWMutex

	mu      sync.Mutex
	closed  bool
	running sync.WaitGroup // operations in progress

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	kick   chan struct{} // asks the collector for a collection
	wg     sync.WaitGroup
}

// Open opens (creating if needed) the caches under cfg's directories,
// removes what a crashed daemon left in BuildDir/tmp, and starts the
// garbage collector, which runs once right away (templates may have been
// deleted while no collector ran) and then whenever Collect asks.
func Open(cfg Config) (*Service, error) {
	if cfg.Manager == nil || cfg.CacheDir == "" || cfg.BuildDir == "" {
		return nil, errors.New("image service needs a manager, a cache dir and a build dir")
	}
	cache, err := ociimage.OpenCache(cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	snaps, err := ociimage.OpenDirStepCache(cfg.BuildDir)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, m: cfg.Manager, cache: cache, snaps: snaps, log: cfg.Logger, kick: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("clearing build temporary files: %w", err)
	}
	if err := os.MkdirAll(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating build temporary directory: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.collectLoop()
	s.Collect()
	return s, nil
}

func (s *Service) tmpDir() string { return filepath.Join(s.cfg.BuildDir, "tmp") }

// Close cancels running pulls, imports and builds, waits for them and for
// the collector, and refuses new operations. It is safe to call more than
// once.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.running.Wait()
	s.wg.Wait()
	return nil
}

// begin starts an operation: it holds ops shared and returns a context
// that Close cancels, and the function that ends the operation.
func (s *Service) begin(ctx context.Context) (context.Context, func(), error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errdefs.Errorf(errdefs.ErrUnavailable, "the image service is shutting down")
	}
	s.running.Add(1)
	s.mu.Unlock()
	s.ops.RLock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
		s.ops.RUnlock()
		s.running.Done()
	}, nil
}

// CheckName returns an error when name cannot be the name of a new
// template: it is malformed (errdefs.ErrInvalidArgument) or taken
// (errdefs.ErrAlreadyExists), by any tenant: names are one namespace.
// Callers use it to fail before they start a long operation or a stream;
// the operations check again.
func (s *Service) CheckName(name string) error {
	if err := sandbox.ValidateTemplateName(name); err != nil {
		return err
	}
	if s.m.TemplateExists(name) {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name)
	}
	return nil
}

// PullOptions say what Pull fetches and where it reports.
type PullOptions struct {
	// Ref is the image reference ("python:3.12", "host:5000/app@sha256:…").
	Ref string
	// Platform picks the image of a multi-platform index, as "os/arch";
	// empty means ociimage.DefaultPlatform.
	Platform string
	// Insecure allows plain HTTP to the registry (loopback registries use
	// it anyway).
	Insecure bool
	// Progress, if not nil, receives transfer progress, from several
	// goroutines at once.
	Progress func(ociimage.Progress)
	// Log, if not nil, receives a few lines about what happens.
	Log io.Writer
	// Service, if set, is the template's service (the image's own CMD
	// and ENTRYPOINT never start by themselves).
	Service *sandbox.Service
}

// Pull pulls opts.Ref into the image cache and makes template name from
// it, with the image's configuration as the template's defaults. Errors
// are those of ociimage.Cache.Pull and Manager.CreateTemplateFrom (an
// existing name: errdefs.ErrAlreadyExists). Nothing is left of a failed
// pull but cached blobs, which the next collection removes.
func (s *Service) Pull(ctx context.Context, name string, opts PullOptions) (sandbox.Template, error) {
	if opts.Ref == "" {
		return sandbox.Template{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "an image reference is required")
	}
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
	log := logWriter(opts.Log)
	began := time.Now()
	img, err := s.cache.Pull(ctx, opts.Ref, ociimage.PullOptions{
		Platform: opts.Platform, Keychain: s.cfg.Keychain, Insecure: opts.Insecure, Progress: opts.Progress,
	})
	if err != nil {
		return sandbox.Template{}, err
	}
	fmt.Fprintf(log, "pulled %s (%s)\n", opts.Ref, img.Digest)
	t, err := s.makeTemplate(ctx, sandbox.Template{Name: name, Source: "pull", Image: opts.Ref, Service: opts.Service}, img, log)
	if err != nil {
		return sandbox.Template{}, err
	}
	s.log.Info("template pulled", "template", name, "image", opts.Ref, "digest", img.Digest.String(),
		"duration_ms", time.Since(began).Milliseconds())
	return t, nil
}

// makeTemplate makes template t (its name, source, image reference and
// service) by unpacking img, recording the image's digest and
// configuration. The caller holds ops (begin).
func (s *Service) makeTemplate(ctx context.Context, t sandbox.Template, img *ociimage.Image, log io.Writer) (sandbox.Template, error) {
	d := sandbox.Defaults(img.Defaults())
	fmt.Fprintf(log, "unpacking %d layers into template %s\n", len(img.Manifest.Layers), t.Name)
	t.Digest, t.Defaults = img.Digest.String(), &d
	return s.m.CreateTemplateFrom(ctx, t, func(dir string) error {
		if err := img.Unpack(ctx, dir); err != nil {
			return err
		}
		return ensureDir(dir, d.WorkingDir)
	})
}

// ensureDir makes the absolute directory p inside the tree at dir, as a
// runtime does for an image's working directory that no layer made.
func ensureDir(dir, p string) error {
	rel := strings.TrimLeft(path.Clean("/"+p), "/")
	if rel == "" {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return fmt.Errorf("creating working directory %s: %w", p, err)
	}
	return nil
}

// GCStats say what a collection removed.
type GCStats struct {
	// Blobs and Bytes count the image blobs removed; Snapshots the build
	// step results.
	Blobs     int
	Bytes     int64
	Snapshots int
}

// Collect asks the collector to run soon, in the background; requests
// that arrive while one is pending are merged. Call it after templates
// were deleted.
func (s *Service) Collect() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Service) collectLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		}
		if _, err := s.GC(s.ctx); err != nil && s.ctx.Err() == nil {
			s.log.Error("collecting image and build caches", "err", err)
		}
	}
}

// GC removes the image blobs and build step results that no template
// needs: a template keeps every blob of the image it names (Digest) and
// the build results of its BuildKeys. Results of failed builds go too. It
// waits until no operation runs, without holding new ones back meanwhile
// (a long build would otherwise stall every pull behind a waiting
// collection), and holds new ones while it runs. Cost: a read of every
// kept image's manifest and config, and a directory listing of each cache.
func (s *Service) GC(ctx context.Context) (GCStats, error) {
	if err := s.lockOps(ctx); err != nil {
		return GCStats{}, err
	}
	defer s.ops.Unlock()
	began := time.Now()
	blobs := map[v1.Hash]bool{}
	keys := map[string]bool{}
	for _, t := range s.m.Templates(tenancy.AsDaemon(ctx)) { // every tenant's
		for _, k := range t.BuildKeys {
			keys[k] = true
		}
		if t.Digest == "" {
			continue
		}
		h, err := v1.NewHash(t.Digest)
		if err != nil {
			s.log.Warn("template names a malformed image digest", "template", t.Name, "digest", t.Digest)
			continue
		}
		blobs[h] = true
		img, err := s.cache.Image(ctx, h)
		if err != nil {
			// Blobs already gone: the image pulls again when needed.
			continue
		}
		for _, b := range img.Blobs() {
			blobs[b] = true
		}
	}
	var st GCStats
	cs, err := s.cache.GC(ctx, blobs)
	st.Blobs, st.Bytes = cs.Blobs, cs.Bytes
	if err != nil {
		return st, err
	}
	if st.Snapshots, err = s.snaps.GC(ctx, keys); err != nil {
		return st, err
	}
	if st.Blobs > 0 || st.Snapshots > 0 {
		s.log.Info("image caches collected", "blobs", st.Blobs, "bytes", st.Bytes, "snapshots", st.Snapshots,
			"duration_ms", time.Since(began).Milliseconds())
	}
	return st, nil
}

// lockOps takes ops exclusively once no operation holds it, polling: a
// blocked Lock would keep new operations out while it waits.
func (s *Service) lockOps(ctx context.Context) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for !s.ops.TryLock() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// logWriter returns w, or io.Discard for nil.
func logWriter(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
