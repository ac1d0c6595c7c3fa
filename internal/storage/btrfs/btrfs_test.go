package btrfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/rootfs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/storagetest"
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
	return openTestBackend(t, dir), dir
}

// openTestBackend opens a backend on dir and registers its Close and
// leak check like newTestBackend.
func openTestBackend(t testing.TB, dir string) *Backend {
	t.Helper()
	b, err := New(t.Context(), Config{Dir: dir, QuotaCheckInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
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
	storagetest.Run(t, storagetest.Config{
		New: func(t *testing.T) storage.Backend {
			b, _ := newTestBackend(t)
			return b
		},
		Reopen: func(t *testing.T, old storage.Backend) storage.Backend {
			return openTestBackend(t, old.(*Backend).dir)
		},
		Caps: storagetest.Capabilities{SealedTemplates: true, DiskLimit: true, IDMap: true, VolumeLimit: true},
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
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	must(t, b.DeleteRoot(t.Context(), "r1"))
	must(t, b.Close())
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
	// The seed's floor is a file, so it outlives the mount.
	checkNewInodes(t, b2, "base")
}

// An image made before the seed existed (or one whose seed was lost) has
// templates but no seed: New makes one with a floor above them.
func TestNewMakesSeedForOldTemplates(t *testing.T) {
	b, dir := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", func(dir string) error {
		for i := range 50 {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, deleteSubvol(b.base, "seed"))

	b2, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	checkNewInodes(t, b2, "base")
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

// A mounted root (and a sandbox's bind mount of it, here one outside the
// state dir) holds the filesystem. Close cannot free the loop device then
// and says so; the root keeps working, and a New before it goes mounts the
// same device again.
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
	if _, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	if !b.quotasEnabled() {
		t.Fatal("quotas off after a limited root")
	}
	id := subvolIDOf(t, filepath.Join(b.rootsDir(), "limited"))
	qg := filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id))
	maxExcl, err := os.ReadFile(filepath.Join(qg, "max_exclusive"))
	if err != nil || string(maxExcl) != fmt.Sprintf("%d\n", 4<<20) {
		t.Errorf("qgroup 0/%d max_exclusive = %q, %v; want %d", id, maxExcl, err, 4<<20)
	}
	plainID := subvolIDOf(t, filepath.Join(b.rootsDir(), "plain"))

	start := time.Now()
	if err := b.DeleteRoot(t.Context(), "limited"); err != nil {
		t.Fatal(err)
	}
	t.Logf("DeleteRoot with a qgroup took %v", time.Since(start))
	waitQgroupGone(t, b, id)
	// A root made before quotas were on loses its qgroup on delete too,
	// if it has one.
	if err := b.DeleteRoot(t.Context(), "plain"); err != nil {
		t.Fatal(err)
	}
	waitQgroupGone(t, b, plainID)
}

// waitQgroupGone waits until qgroup 0/id has been removed.
func waitQgroupGone(t *testing.T, b *Backend, id uint64) {
	t.Helper()
	waitReleased(t, b)
	if _, err := os.Stat(filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("qgroup 0/%d of a deleted root is still there: %v", id, err)
	}
}

// A sandbox cannot create subvolumes in its root (see
// TestSubvolumeIoctlsRejected), but a host tool can in the root's
// subvolume; DeleteRoot must delete them too, read-only ones included.
func TestDeleteRootWithNestedSubvolumes(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); err != nil {
		t.Fatal(err)
	}
	sv := filepath.Join(b.rootsDir(), "r1")
	upper := filepath.Join(sv, "upper")
	must(t, os.MkdirAll(filepath.Join(upper, "deep/dir"), 0o755))
	must(t, subvolCreateAt(filepath.Join(upper, "deep/dir"), "a"))
	must(t, subvolCreateAt(filepath.Join(upper, "deep/dir/a"), "b"))
	must(t, os.WriteFile(filepath.Join(upper, "deep/dir/a/b/file"), []byte("x"), 0o644))
	// A read-only snapshot of a, holding a subvolume of its own.
	must(t, subvolCreateAt(filepath.Join(upper, "deep/dir/a"), "c"))
	must(t, snapshotAt(filepath.Join(upper, "deep/dir/a"), upper, "snap", subvolRdonly))
	must(t, subvolCreateAt(filepath.Join(upper, "deep/dir/a/c"), "d"))
	must(t, setReadOnly(filepath.Join(upper, "deep/dir/a/c"), true))

	if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatalf("DeleteRoot: %v", err)
	}
	for _, p := range []string{sv, b.RootPath("r1")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists: %v", p, err)
		}
	}
}

// After a host reboot every mount is gone: the image's and the roots'
// overlays. New must still find the roots, half-made ones included (a
// crash in the middle of CreateRoot), and DeleteRoot must clean them up.
// (The conformance suite covers a restart without a reboot.)
func TestRestartAfterReboot(t *testing.T) {
	b, dir := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	for id, limit := range map[string]int64{"plain": 0, "limited": 8 << 20} {
		if _, err := b.CreateRoot(t.Context(), id, "base", storage.RootOptions{DiskBytes: limit}); err != nil {
			t.Fatal(err)
		}
		must(t, unix.Unmount(b.RootPath(id), 0))
	}
	must(t, b.snapshotSeed("half"))
	must(t, b.Close())

	b2, err := New(t.Context(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndCheck(t, b2, dir) })
	rs, err := b2.Roots(t.Context())
	if diff := cmp.Diff([]string{"half", "limited", "plain"}, rs); err != nil || diff != "" {
		t.Errorf("Roots after reboot (-want +got):\n%s %v", diff, err)
	}
	for _, id := range rs {
		if err := b2.DeleteRoot(t.Context(), id); err != nil {
			t.Errorf("DeleteRoot(%s) after reboot: %v", id, err)
		}
	}
	if rs, err := b2.Roots(t.Context()); err != nil || len(rs) != 0 {
		t.Errorf("Roots after deleting all = %v, %v", rs, err)
	}
	if ents, err := os.ReadDir(b2.mergedDir()); err != nil || len(ents) != 0 {
		t.Errorf("mount points left: %v, %v", ents, err)
	}
}

// A root on a plain snapshot let the sandbox create subvolumes, whose
// qgroups are outside the root's limit. Through overlayfs the subvolume
// ioctls fail, and the limit holds wherever the sandbox writes.
func TestSubvolumeIoctlsRejected(t *testing.T) {
	b, _ := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	const limit = 8 << 20
	path, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{DiskBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { must(t, b.DeleteRoot(context.Background(), "r1")) })
	must(t, os.Mkdir(filepath.Join(path, "dir"), 0o755))
	dirFd, err := openDir(filepath.Join(path, "dir"))
	must(t, err)
	defer unix.Close(dirFd)
	for _, req := range SubvolumeIoctls() {
		// v1 requests carry the name at offset 8, v2 at offset 56.
		var arg [4096]byte
		off := 8
		if req == uint64(iocSnapCreateV2) || req == uint64(iocSubvolCreateV2) {
			off = 56
		}
		binary.NativeEndian.PutUint64(arg[:], uint64(dirFd)) // snapshot source
		copy(arg[off:], "escape")
		err := ioctl(dirFd, uintptr(req), unsafe.Pointer(&arg))
		t.Logf("ioctl %#x in the root: %v", req, err)
		if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("ioctl %#x in the root = %v, want ENOTTY, EINVAL or EOPNOTSUPP", req, err)
		}
		if _, err := os.Lstat(filepath.Join(path, "dir/escape")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ioctl %#x created dir/escape: %v", req, err)
		}
	}
	n, err := fillUntil(filepath.Join(path, "dir/big"), 4*limit)
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing %d bytes into a root limited to %d: %v, want EDQUOT or ENOSPC", n, limit, err)
	}
}

// Overlayfs copies a template file up to the root's subvolume when the
// sandbox first writes to it; on one btrfs filesystem that copy is a
// clone, so it takes no data copy and no quota.
func TestCopyUpClones(t *testing.T) {
	b, _ := newTestBackend(t)
	const size = 64 << 20
	must(t, b.CreateTemplate(t.Context(), "big", func(dir string) error {
		_, err := fillUntil(filepath.Join(dir, "big"), size)
		return err
	}))
	// A limit far below the file: copying its data would fail.
	const limit = 4 << 20
	path, err := b.CreateRoot(t.Context(), "r1", "big", storage.RootOptions{DiskBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { must(t, b.DeleteRoot(context.Background(), "r1")) })

	start := time.Now()
	f, err := os.OpenFile(filepath.Join(path, "big"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write([]byte("x"))
	must(t, errors.Join(err, f.Close()))
	appendTook := time.Since(start)

	// For scale: a plain copy of the same file, outside any limit.
	start = time.Now()
	_, err = copyFile(b.TemplatePath("big")+"/big", filepath.Join(b.base, "copy"))
	must(t, err)
	copyTook := time.Since(start)
	must(t, os.Remove(filepath.Join(b.base, "copy")))

	fd, err := openDir(b.base)
	must(t, err)
	defer unix.Close(fd)
	must(t, syncFS(fd)) // qgroup numbers are updated at commit
	id := subvolIDOf(t, filepath.Join(b.rootsDir(), "r1"))
	excl := readUint(t, filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id), "exclusive"))
	t.Logf("appending a byte to a %d MiB template file: %v (copying it: %v); root's exclusive bytes: %d",
		size>>20, appendTook, copyTook, excl)
	if excl > 1<<20 {
		t.Errorf("root's exclusive bytes = %d after appending one byte, want the file's extents shared", excl)
	}
	if st, err := os.Stat(filepath.Join(path, "big")); err != nil || st.Size() != size+1 {
		t.Errorf("root's file: %v, %v; want %d bytes", st, err, size+1)
	}
	if st, err := os.Stat(filepath.Join(b.TemplatePath("big"), "big")); err != nil || st.Size() != size {
		t.Errorf("template's file: %v, %v; want %d bytes", st, err, size)
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
		mode string
	}{
		{"plain", storage.RootOptions{}, ""},
		{"disk-limit-simple", storage.RootOptions{DiskBytes: 1 << 30}, QuotaSimple},
		{"disk-limit-full", storage.RootOptions{DiskBytes: 1 << 30}, QuotaFull},
	} {
		b.Run(bc.name, func(b *testing.B) {
			testutil.RequiresBinary(b, "busybox")
			be := openModeBackend(b, bc.mode, nil)
			ctx := b.Context()
			if err := be.CreateTemplate(ctx, "busybox", func(dir string) error { return rootfs.FillBusybox(dir, "") }); err != nil {
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

// BenchmarkFirstRead times the first read of a 2 MB template file in a
// fresh root, with the template's own copy of the file already cached (as
// it is once any sandbox has run): "overlay" is a root of this backend,
// "snapshot" one made the way the backend used to, as a writable snapshot
// of the template, whose files are inodes of their own, and "template"
// reads the template's file itself, which is what a cached read costs.
func BenchmarkFirstRead(b *testing.B) {
	for _, mode := range []string{"template", "overlay", "snapshot"} {
		b.Run(mode, func(b *testing.B) {
			be, _ := newTestBackend(b)
			ctx := b.Context()
			const size = 2 << 20
			if err := be.CreateTemplate(ctx, "t", func(dir string) error {
				_, err := fillUntil(filepath.Join(dir, "lib.so"), size)
				return err
			}); err != nil {
				b.Fatal(err)
			}
			if _, err := os.ReadFile(filepath.Join(be.TemplatePath("t"), "lib.so")); err != nil {
				b.Fatal(err)
			}
			var read time.Duration
			n := 0
			for ; b.Loop(); n++ {
				id := fmt.Sprintf("r%d", n)
				var path string
				var err error
				switch mode {
				case "template":
					path = be.TemplatePath("t")
				case "overlay":
					path, err = be.CreateRoot(ctx, id, "t", storage.RootOptions{})
				case "snapshot":
					path = filepath.Join(be.base, id)
					err = snapshotAt(be.TemplatePath("t"), be.base, id, 0)
				}
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				data, err := os.ReadFile(filepath.Join(path, "lib.so"))
				read += time.Since(t0)
				if err != nil || len(data) != size {
					b.Fatalf("reading lib.so: %d bytes, %v", len(data), err)
				}
				switch mode {
				case "overlay":
					err = be.DeleteRoot(ctx, id)
				case "snapshot":
					err = deleteSubvol(be.base, id)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(read.Nanoseconds())/float64(n), "read-ns/op")
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

// checkNewInodes makes a root of template and checks that a file created
// in it is numbered above every inode of the template.
func checkNewInodes(t *testing.T, b *Backend, template string) {
	t.Helper()
	path, err := b.CreateRoot(t.Context(), "inodes", template, storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { must(t, b.DeleteRoot(t.Context(), "inodes")) }()
	must(t, os.WriteFile(filepath.Join(path, "new"), nil, 0o644))
	st, err := os.Lstat(filepath.Join(path, "new"))
	must(t, err)
	tmplMax, err := maxIno(b.TemplatePath(template))
	must(t, err)
	if ino := st.Sys().(*syscall.Stat_t).Ino; ino <= tmplMax {
		t.Errorf("new file has inode %d, not above the template's largest %d", ino, tmplMax)
	}
}

func readUint(t *testing.T, path string) uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fillUntil writes up to n bytes of a repeating pattern to a new file at
// path and syncs it, returning how much it wrote and the first error.
func fillUntil(path string, n int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	chunk := bytes.Repeat([]byte("corral\n"), (1<<20)/7+1)[:1<<20]
	var written int64
	for written < n && err == nil {
		var k int
		k, err = f.Write(chunk[:min(int64(len(chunk)), n-written)])
		written += int64(k)
	}
	if err == nil {
		err = f.Sync()
	}
	return written, errors.Join(err, f.Close())
}

// copyFile copies src's data to a new file dst through a buffer: io.Copy
// between two files would use copy_file_range, which btrfs answers with a
// clone.
func copyFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(struct{ io.Writer }{out}, struct{ io.Reader }{in})
	if err == nil {
		err = out.Sync()
	}
	return n, errors.Join(err, out.Close())
}
