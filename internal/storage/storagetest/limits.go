package storagetest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

// testDiskLimit checks that a backend with Capabilities.DiskLimit enforces
// DiskBytes (writes past it fail with EDQUOT or ENOSPC, writes below it
// succeed) and that one without refuses it with ErrNotImplemented and
// leaves nothing behind.
func testDiskLimit(t *testing.T, b storage.Backend, caps Capabilities) {
	createTemplate(t, b, "base")
	const limit = 16 << 20
	path, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: limit})
	if !caps.DiskLimit {
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatalf("CreateRoot with a disk limit = %v, want ErrNotImplemented (no Capabilities.DiskLimit)", err)
		}
		if got := roots(t, b); len(got) != 0 {
			t.Errorf("Roots after refused limit = %v, want none", got)
		}
		if _, err := os.Lstat(b.RootPath("limited")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("refused root left %s: %v", b.RootPath("limited"), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("CreateRoot with a disk limit: %v", err)
	}
	t.Cleanup(func() {
		if err := b.DeleteRoot(context.Background(), "limited"); err != nil {
			t.Errorf("DeleteRoot(limited): %v", err)
		}
	})
	// Below the limit: fine.
	mustWrite(t, filepath.Join(path, "small"), strings.Repeat("s", 1<<20))

	written, err := fillUntilError(filepath.Join(path, "big"), 4*limit)
	if err == nil {
		t.Fatalf("wrote %d bytes into a root limited to %d", written, limit)
	}
	if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past the limit failed with %v, want EDQUOT or ENOSPC", err)
	}
	if written > limit {
		t.Errorf("wrote %d bytes before the limit of %d bit", written, limit)
	}
	t.Logf("write failed after %d bytes with %v", written, err)

	// An unlimited root next to it is not limited.
	other := createRoot(t, b, "unlimited", "base")
	if n, err := fillUntilError(filepath.Join(other, "big"), 2*limit); err != nil {
		t.Errorf("unlimited root: write failed after %d bytes: %v", n, err)
	}
}

// fillUntilError writes and syncs up to max bytes to a new file at path,
// in 1 MiB chunks, and returns how much it wrote and the first error.
func fillUntilError(path string, max int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	chunk := []byte(strings.Repeat("q", 1<<20))
	var written int64
	for written < max {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			f.Close()
			return written, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return written, err
	}
	return written, f.Close()
}
