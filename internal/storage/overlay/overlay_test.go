package overlay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/rootfs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
	"github.com/corralrun/corral/internal/storage/storagetest"
	"github.com/corralrun/corral/internal/testutil"
)

// newTestBackend opens a backend in a temporary dir and registers, to run
// before the dir is removed, its Close and a check that no mount is left
// under the dir. Whatever the check finds it also unmounts, so a failing
// test does not leak mounts.
func newTestBackend(t testing.TB) (*Backend, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	return openTestBackend(t, dir), dir
}

// openTestBackend opens a backend on dir and registers its Close and
// leak check like newTestBackend.
func openTestBackend(t testing.TB, dir string) *Backend {
	t.Helper()
	b, err := New(t.Context(), Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { closeAndCheck(t, b, dir) })
	return b
}

func closeAndCheck(t testing.TB, b *Backend, dir string) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if m := testutil.Mounts(t, dir); len(m) > 0 {
		t.Errorf("mounts left after Close: %v", m)
		for i := len(m) - 1; i >= 0; i-- {
			unix.Unmount(m[i], unix.MNT_DETACH)
		}
	}
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Config{
		New: func(t *testing.T) storage.Backend {
			b, _ := newTestBackend(t)
			return b
		},
		Reopen: func(t *testing.T, old storage.Backend) storage.Backend {
			return openTestBackend(t, old.(*Backend).dir)
		},
		Caps: storagetest.Capabilities{SealedTemplates: true, IDMap: true},
	})
}

func TestDiskLimitNotImplemented(t *testing.T) {
	b, _ := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	_, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{DiskBytes: 1 << 20})
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("CreateRoot with DiskBytes = %v, want ErrNotImplemented", err)
	}
	if rs, _ := b.Roots(t.Context()); len(rs) != 0 {
		t.Errorf("Roots = %v, want none", rs)
	}
}

// The daemon restarts (no Close) and the host may have rebooted (mounts
// gone): New seals the templates again, roots whose mount is gone can
// still be deleted, and new roots work.
func TestRestart(t *testing.T) {
	b, dir := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	kept, err := b.CreateRoot(t.Context(), "kept", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateRoot(t.Context(), "rebooted", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of CreateTemplate and of CreateRoot.
	if err := os.MkdirAll(filepath.Join(dir, "templates", fsutil.TempName("half"), "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "roots", "half", "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The reboot took the template seal and one root's mount.
	must(t, unix.Unmount(b.TemplatePath("base"), 0))
	must(t, unix.Unmount(b.RootPath("rebooted"), 0))

	b2, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndCheck(t, b2, dir) })
	if sealed, err := fsutil.IsMountPoint(b2.TemplatePath("base")); err != nil || !sealed {
		t.Errorf("template not sealed again after restart: %v, %v", sealed, err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "templates"))
	if len(ents) != 1 {
		t.Errorf("templates dir after restart has %d entries, want 1 (no unfinished template)", len(ents))
	}
	rs, err := b2.Roots(t.Context())
	if diff := cmp.Diff([]string{"half", "kept", "rebooted"}, rs); err != nil || diff != "" {
		t.Errorf("Roots after restart (-want +got):\n%s %v", diff, err)
	}
	if b, err := os.ReadFile(filepath.Join(kept, "f")); err != nil || string(b) != "1" {
		t.Errorf("surviving root reads %q, %v", b, err)
	}
	for _, id := range []string{"half", "rebooted", "kept"} {
		if err := b2.DeleteRoot(t.Context(), id); err != nil {
			t.Errorf("DeleteRoot(%s): %v", id, err)
		}
	}
	path, err := b2.CreateRoot(t.Context(), "new", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(path, "f")); err != nil || string(b) != "1" {
		t.Errorf("new root reads %q, %v", b, err)
	}
	must(t, b2.DeleteRoot(t.Context(), "new"))
	if rs, _ := b2.Roots(t.Context()); len(rs) != 0 {
		t.Errorf("Roots = %v, want none", rs)
	}
}

func TestDeleteRootBusy(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	path, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An open file keeps the mount busy; DeleteRoot must still finish.
	f, err := os.Open(filepath.Join(path, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	must(t, b.DeleteRoot(t.Context(), "r1"))
	t.Logf("DeleteRoot of a busy root took %v", time.Since(start))
	if _, err := os.Lstat(filepath.Join(filepath.Dir(path))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("root dir still exists: %v", err)
	}
}

func TestNewRejectsOptionChars(t *testing.T) {
	_, err := New(context.Background(), Config{Dir: filepath.Join(t.TempDir(), "a,b")})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New with a comma in Dir = %v, want ErrInvalidArgument", err)
	}
}

func BenchmarkCreateRoot(b *testing.B) {
	testutil.RequiresBinary(b, "busybox")
	be, _ := newTestBackend(b)
	ctx := b.Context()
	if err := be.CreateTemplate(ctx, "busybox", func(dir string) error { return rootfs.FillBusybox(dir, "") }); err != nil {
		b.Fatal(err)
	}
	var create, del time.Duration
	n := 0
	for ; b.Loop(); n++ {
		id := fmt.Sprintf("r%d", n)
		t0 := time.Now()
		if _, err := be.CreateRoot(ctx, id, "busybox", storage.RootOptions{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := be.DeleteRoot(ctx, id); err != nil {
			b.Fatal(err)
		}
		create += t1.Sub(t0)
		del += time.Since(t1)
	}
	b.ReportMetric(float64(create.Nanoseconds())/float64(n), "create-ns/op")
	b.ReportMetric(float64(del.Nanoseconds())/float64(n), "delete-ns/op")
}

func writeFile(name, content string) func(string) error {
	return func(dir string) error {
		return os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
