package ociimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corralrun/corral/internal/errdefs"
)

// Cache is a content-addressed store of image blobs (manifests, configs,
// layers) under one directory:
//
//	blobs/sha256/<hex>   one file per blob, named by the sha256 of its bytes
//	tmp/                 blobs being written
//
// A blob is verified while it is written (its digest, and its size when
// the descriptor gives one) and renamed into place only when it matches,
// so a file under blobs/ is always complete; it is verified again while it
// is read, and a blob that no longer matches is removed and reported as
// errdefs.ErrInternal. Pulls and loads write only the blobs that are
// missing, so a second pull of an image transfers its manifest and nothing
// else.
//
// A Cache is safe for concurrent use. GC excludes every other operation of
// the same Cache while it runs. One Cache per directory: two processes
// sharing a directory could remove each other's temporary files.
type Cache struct {
	dir string
	// mu is held shared by operations that read or write blobs and
	// exclusively by GC, so GC never removes a blob an operation is
	// about to use.
	mu sync.RWMutex
}

// Size limits for blobs held in memory. The distribution spec suggests
// registries accept manifests up to 4 MiB; configs hold history and can be
// larger.
const (
	maxManifestBytes = 4 << 20
	maxConfigBytes   = 16 << 20
)

// OpenCache opens (creating if needed) the cache in dir and removes
// temporary files a crashed process left behind.
func OpenCache(dir string) (*Cache, error) {
	c := &Cache{dir: dir}
	if err := os.RemoveAll(c.tmpDir()); err != nil {
		return nil, fmt.Errorf("clearing image cache temporary files: %w", err)
	}
	for _, d := range []string{c.blobDir(), c.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating image cache directory: %w", err)
		}
	}
	return c, nil
}

// Dir is the directory the cache lives in.
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) blobDir() string { return filepath.Join(c.dir, "blobs", "sha256") }
func (c *Cache) tmpDir() string  { return filepath.Join(c.dir, "tmp") }

// checkDigest refuses digests this cache cannot hold. Digests that
// v1.NewHash or JSON parsing accepted contain only hex digits, so a valid
// one is also a safe file name.
func checkDigest(d v1.Hash) error {
	if d.Algorithm != "sha256" {
		return fmt.Errorf("digest %q: only sha256 digests are supported: %w", d, errdefs.ErrNotImplemented)
	}
	if len(d.Hex) != 64 {
		return fmt.Errorf("digest %q is malformed: %w", d, errdefs.ErrInvalidArgument)
	}
	if _, err := hex.DecodeString(d.Hex); err != nil {
		return fmt.Errorf("digest %q is malformed: %w", d, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (c *Cache) blobPath(d v1.Hash) string { return filepath.Join(c.blobDir(), d.Hex) }

// Has reports whether the blob d is in the cache. It does not read it.
func (c *Cache) Has(d v1.Hash) bool {
	if checkDigest(d) != nil {
		return false
	}
	_, err := os.Stat(c.blobPath(d))
	return err == nil
}

// put writes the blob read from r into the cache unless it is there
// already, verifying that its bytes hash to want and, when size >= 0, that
// there are exactly size of them; it reads at most size+1 bytes so a source
// that sends more cannot fill the disk. onRead, if not nil, is called with
// the running byte count. A blob that does not match is refused with
// errdefs.ErrInvalidArgument and leaves nothing behind. put returns the
// blob's size.
func (c *Cache) put(ctx context.Context, want v1.Hash, size int64, r io.Reader, onRead func(int64)) (int64, error) {
	if err := checkDigest(want); err != nil {
		return 0, err
	}
	if fi, err := os.Stat(c.blobPath(want)); err == nil {
		return fi.Size(), nil
	}
	f, err := os.CreateTemp(c.tmpDir(), want.Hex+".*")
	if err != nil {
		return 0, fmt.Errorf("creating temporary file for blob %s: %w", want, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	src := r
	if size >= 0 {
		src = io.LimitReader(r, size+1)
	}
	n, err := copyCounting(ctx, io.MultiWriter(f, h), src, onRead)
	if err != nil {
		return 0, fmt.Errorf("reading blob %s: %w", want, err)
	}
	if size >= 0 && n != size {
		return 0, fmt.Errorf("blob %s does not match its descriptor (%d bytes, want %d): %w", want, n, size, errdefs.ErrInvalidArgument)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.Hex {
		return 0, fmt.Errorf("blob %s does not match its digest (content hashes to sha256:%s): %w", want, got, errdefs.ErrInvalidArgument)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("writing blob %s: %w", want, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("writing blob %s: %w", want, err)
	}
	if err := os.Rename(f.Name(), c.blobPath(want)); err != nil {
		return 0, fmt.Errorf("storing blob %s: %w", want, err)
	}
	done = true
	return n, nil
}

// putBytes is put for a blob already in memory.
func (c *Cache) putBytes(ctx context.Context, want v1.Hash, b []byte) error {
	_, err := c.put(ctx, want, int64(len(b)), bytes.NewReader(b), nil)
	return err
}

// copyCounting copies r to w in chunks, checking ctx between them and
// reporting the running count to onRead.
func copyCounting(ctx context.Context, w io.Writer, r io.Reader, onRead func(int64)) (int64, error) {
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
			if onRead != nil {
				onRead(n)
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// open returns a reader of the blob d that verifies it while it is read:
// the Read that reaches the end returns an error wrapping
// errdefs.ErrInternal instead of io.EOF when the bytes do not hash to d,
// and the corrupt blob is removed so that the next pull fetches it again.
// A missing blob returns an error wrapping errdefs.ErrNotFound.
func (c *Cache) open(d v1.Hash) (*blobReader, error) {
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	f, err := os.Open(c.blobPath(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s is not in the image cache: %w", d, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("opening blob %s: %w", d, err)
	}
	return &blobReader{f: f, h: sha256.New(), want: d}, nil
}

// readBlob reads a whole blob of at most limit bytes, verified.
func (c *Cache) readBlob(d v1.Hash, limit int64) ([]byte, error) {
	r, err := c.open(d)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("blob %s is larger than %d bytes: %w", d, limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// blobReader reads a cached blob and checks its digest at the end.
type blobReader struct {
	f    *os.File
	h    hash.Hash
	want v1.Hash
	err  error
}

func (r *blobReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.f.Read(p)
	r.h.Write(p[:n])
	if err == io.EOF {
		if got := hex.EncodeToString(r.h.Sum(nil)); got != r.want.Hex {
			os.Remove(r.f.Name())
			r.err = fmt.Errorf("blob %s in the image cache is corrupt (hashes to sha256:%s) and was removed; pull the image again: %w", r.want, got, errdefs.ErrInternal)
			return n, r.err
		}
		r.err = io.EOF
	} else if err != nil {
		r.err = err
	}
	return n, err
}

func (r *blobReader) Close() error { return r.f.Close() }

// GCStats says what GC removed.
type GCStats struct {
	// Blobs is the number of blobs removed, Bytes their total size.
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
}

// GC removes every blob whose digest is not in keep, and any temporary
// files. Callers build keep from Image.Blobs of the images they want to
// keep pulling without the network (for example those that templates came
// from); an image whose blobs are removed still pulls, it just downloads
// again. GC waits for running pulls, loads and unpacks of this Cache and
// blocks new ones until it is done. It does not see an Image that a caller
// holds but has not yet unpacked: collect only while no image is between
// Pull and Unpack, or put it in keep.
func (c *Cache) GC(ctx context.Context, keep map[v1.Hash]bool) (GCStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var st GCStats
	entries, err := os.ReadDir(c.blobDir())
	if err != nil {
		return st, fmt.Errorf("listing image cache: %w", err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if keep[v1.Hash{Algorithm: "sha256", Hex: e.Name()}] {
			continue
		}
		var size int64
		if fi, err := e.Info(); err == nil {
			size = fi.Size()
		}
		if err := os.RemoveAll(filepath.Join(c.blobDir(), e.Name())); err != nil {
			return st, fmt.Errorf("removing blob sha256:%s: %w", e.Name(), err)
		}
		st.Blobs++
		st.Bytes += size
	}
	tmp, err := os.ReadDir(c.tmpDir())
	if err != nil {
		return st, fmt.Errorf("listing image cache temporary files: %w", err)
	}
	for _, e := range tmp {
		if err := os.RemoveAll(filepath.Join(c.tmpDir(), e.Name())); err != nil {
			return st, fmt.Errorf("removing temporary file %s: %w", e.Name(), err)
		}
	}
	return st, nil
}
