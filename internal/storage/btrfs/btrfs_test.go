package btrfs

import (
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
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/storagetest"
	"github.com/corralrun/corral/internal/template"
	"github.com/corralrun/corral/internal/testutil"
)

func requirements(t testing.TB) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "mkfs.btrfs")
}

// newTestBackend opens a backend on a fresh loop image in a temporary dir
// and registers, to run before the dir is removed, its Close and a check
// that Close left no mount and no loop device behind. Whatever the check
// finds it also cleans up, so a failing test does not leak either.
func newTestBackend(t testing.TB) (*Backend, string) {
	t.Helper()
	requirements(t)
	dir := t.TempDir()
	b, err := New(t.Context(), Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { closeAndCheck(t, b, dir) })
	return b, dir
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
		for _, p := range m {
			unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	if devs := testutil.LoopDevicesBackedBy(t, dir); len(devs) > 0 {
		t.Errorf("loop devices left after Close: %v", devs)
		for _, d := range devs {
			detachLoop("/dev/" + d)
		}
	}
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		b, _ := newTestBackend(t)
		return b
	})
}

func TestNewUsesBtrfsDirDirectly(t *testing.T) {
	outer, _ := newTestBackend(t)
	dir := filepath.Join(outer.base, "state")
	b, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if b.img != "" || b.base != dir {
		t.Errorf("on btrfs: img %q, base %q; want no image and base %s", b.img, b.base, dir)
	}
	if err := b.CreateTemplate(t.Context(), "base", func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "templates/base")); err != nil {
		t.Errorf("template not under the btrfs dir: %v", err)
	}
	if err := deleteSubvol(filepath.Join(dir, "templates"), "base"); err != nil {
		t.Fatal(err)
	}
}

func TestReopenAfterClose(t *testing.T) {
	b, dir := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	path, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "g"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if devs := testutil.LoopDevicesBackedBy(t, dir); len(devs) > 0 {
		t.Fatalf("loop devices after Close: %v", devs)
	}

	b2, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndCheck(t, b2, dir) })
	got, err := b2.Templates(t.Context())
	if err != nil || !cmp.Equal(got, []string{"base"}) {
		t.Errorf("Templates after reopen = %v, %v", got, err)
	}
	rs, err := b2.Roots(t.Context())
	if err != nil || !cmp.Equal(rs, []string{"r1"}) {
		t.Errorf("Roots after reopen = %v, %v", rs, err)
	}
	if b, err := os.ReadFile(filepath.Join(b2.RootPath("r1"), "g")); err != nil || string(b) != "2" {
		t.Errorf("root data after reopen = %q, %v", b, err)
	}
	if err := b2.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
}

// A daemon killed without Close leaves the image mounted; the next New
// must use that mount, and its Close must still free everything.
func TestNewReusesMount(t *testing.T) {
	b, dir := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of CreateTemplate.
	if err := subvolCreateAt(b.templatesDir(), ".tmp-half-0000"); err != nil {
		t.Fatal(err)
	}
	devs := testutil.LoopDevicesBackedBy(t, dir)

	b2, err := New(t.Context(), Config{Dir: dir}) // b is never closed: it "crashed"
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.LoopDevicesBackedBy(t, dir); !cmp.Equal(devs, got) {
		t.Errorf("loop devices went from %v to %v: New did not reuse the mount", devs, got)
	}
	if got := testutil.Mounts(t, dir); len(got) != 1 {
		t.Errorf("mounts after second New = %v, want one", got)
	}
	got, err := b2.Templates(t.Context())
	if err != nil || !cmp.Equal(got, []string{"base"}) {
		t.Errorf("Templates = %v, %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(b2.templatesDir(), ".tmp-half-0000")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unfinished template survived New: %v", err)
	}
	// newTestBackend's cleanup closes b, which finds the mount gone.
	closeAndCheck(t, b2, dir)
}

// Sandboxes running on roots hold their own mounts of the filesystem
// (here: a bind mount outside the state dir). Close cannot free the loop
// device then and says so; the sandbox keeps working, and a New before it
// exits mounts the same device again.
func TestCloseWhileRootInUse(t *testing.T) {
	outside := t.TempDir()
	b, dir := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	path, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	must(t, unix.Mount(path, outside, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(outside, unix.MNT_DETACH) })
	devs := testutil.LoopDevicesBackedBy(t, dir)

	if err := b.Close(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Close with a root in use = %v, want ErrFailedPrecondition", err)
	}
	must(t, os.WriteFile(filepath.Join(outside, "g"), []byte("2"), 0o644))

	b2, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.LoopDevicesBackedBy(t, dir); !cmp.Equal(devs, got) {
		t.Errorf("loop devices went from %v to %v", devs, got)
	}
	if data, err := os.ReadFile(filepath.Join(b2.RootPath("r1"), "g")); err != nil || string(data) != "2" {
		t.Errorf("reopened root reads %q, %v", data, err)
	}
	must(t, unix.Unmount(outside, 0))
	must(t, b2.DeleteRoot(t.Context(), "r1"))
	closeAndCheck(t, b2, dir)
}

func TestDiskLimitQgroupRemoved(t *testing.T) {
	b, _ := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	if b.quotasEnabled() {
		t.Fatal("quotas on before any limit was asked for")
	}
	// Roots without limits do not turn quotas on.
	if _, err := b.CreateRoot(t.Context(), "plain", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	if b.quotasEnabled() {
		t.Fatal("quotas on after an unlimited root")
	}
	path, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !b.quotasEnabled() {
		t.Fatal("quotas off after a limited root")
	}
	id := subvolIDOf(t, path)
	qg := filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id))
	maxExcl, err := os.ReadFile(filepath.Join(qg, "max_exclusive"))
	if err != nil || string(maxExcl) != fmt.Sprintf("%d\n", 4<<20) {
		t.Errorf("qgroup 0/%d max_exclusive = %q, %v; want %d", id, maxExcl, err, 4<<20)
	}
	plainID := subvolIDOf(t, b.RootPath("plain"))

	start := time.Now()
	if err := b.DeleteRoot(t.Context(), "limited"); err != nil {
		t.Fatal(err)
	}
	t.Logf("DeleteRoot with a qgroup took %v", time.Since(start))
	if _, err := os.Stat(qg); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("qgroup 0/%d still exists after DeleteRoot: %v", id, err)
	}
	// A root made before quotas were on gets its qgroup from the enabling
	// rescan, and loses it on delete too.
	if err := b.DeleteRoot(t.Context(), "plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", plainID))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("qgroup 0/%d still exists after DeleteRoot: %v", plainID, err)
	}
}

// A sandbox can create subvolumes inside its root (btrfs lets any user do
// that); DeleteRoot must delete them too, read-only ones included.
func TestDeleteRootWithNestedSubvolumes(t *testing.T) {
	b, _ := newTestBackend(t)
	if err := b.CreateTemplate(t.Context(), "base", writeFile("f", "1")); err != nil {
		t.Fatal(err)
	}
	path, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.MkdirAll(filepath.Join(path, "deep/dir"), 0o755))
	must(t, subvolCreateAt(filepath.Join(path, "deep/dir"), "a"))
	must(t, subvolCreateAt(filepath.Join(path, "deep/dir/a"), "b"))
	must(t, os.WriteFile(filepath.Join(path, "deep/dir/a/b/file"), []byte("x"), 0o644))
	// A read-only snapshot of a, holding a subvolume of its own.
	must(t, subvolCreateAt(filepath.Join(path, "deep/dir/a"), "c"))
	must(t, snapshotAt(filepath.Join(path, "deep/dir/a"), path, "snap", subvolRdonly))
	must(t, subvolCreateAt(filepath.Join(path, "deep/dir/a/c"), "d"))
	must(t, setReadOnly(filepath.Join(path, "deep/dir/a/c"), true))

	if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatalf("DeleteRoot: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("root still exists: %v", err)
	}
}

func TestCreateTemplateRace(t *testing.T) {
	b, _ := newTestBackend(t)
	// Two creators of one name, both past the existence check: exactly one
	// wins, the loser leaves nothing.
	release := make(chan struct{})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			errs <- b.CreateTemplate(t.Context(), "base", func(dir string) error {
				<-release
				return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
			})
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	var failed int
	for range 2 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d of 2 racing CreateTemplate calls failed, want 1", failed)
	}
	ents, err := os.ReadDir(b.templatesDir())
	if err != nil || len(ents) != 1 {
		t.Errorf("templates dir after race: %v, %v", ents, err)
	}
}

func BenchmarkCreateRoot(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts storage.RootOptions
	}{
		{"plain", storage.RootOptions{}},
		{"disk-limit", storage.RootOptions{DiskBytes: 1 << 30}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			testutil.RequiresBinary(b, "busybox")
			be, _ := newTestBackend(b)
			ctx := b.Context()
			if err := be.CreateTemplate(ctx, "busybox", func(dir string) error { return template.FillBusybox(dir, "") }); err != nil {
				b.Fatal(err)
			}
			var create, del time.Duration
			n := 0
			for ; b.Loop(); n++ {
				id := fmt.Sprintf("r%d", n)
				t0 := time.Now()
				if _, err := be.CreateRoot(ctx, id, "busybox", bc.opts); err != nil {
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
		})
	}
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

func subvolCreateAt(parent, name string) error {
	fd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return subvolCreate(fd, name)
}

func snapshotAt(src, parent, name string, flags uint64) error {
	srcFd, err := openDir(src)
	if err != nil {
		return err
	}
	defer unix.Close(srcFd)
	fd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return snapshot(srcFd, fd, name, flags)
}

func subvolIDOf(t *testing.T, path string) uint64 {
	t.Helper()
	fd, err := openDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
