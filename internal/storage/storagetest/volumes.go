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

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

// volumeOwner is the owner the cases give a volume's top directory: an
// ID no host user has, as the daemon's stored range is.
const volumeOwner = 1<<31 + 7

// volumesOf returns b's Volumes, skipping t when b has none.
func volumesOf(t *testing.T, b storage.Backend) storage.Volumes {
	t.Helper()
	v, ok := b.(storage.Volumes)
	if !ok {
		t.Skipf("backend %s does not implement storage.Volumes", b.Name())
	}
	return v
}

// createVolume creates a volume and registers its deletion.
func createVolume(t *testing.T, v storage.Volumes, name string, size int64) string {
	t.Helper()
	path, err := v.CreateVolume(t.Context(), name, storage.VolumeOptions{SizeBytes: size, UID: volumeOwner, GID: volumeOwner})
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	t.Cleanup(func() {
		if err := v.DeleteVolume(context.Background(), name); err != nil {
			t.Errorf("DeleteVolume(%s): %v", name, err)
		}
	})
	return path
}

func volumeNames(t *testing.T, v storage.Volumes) []string {
	t.Helper()
	got, err := v.Volumes(t.Context())
	if err != nil {
		t.Fatalf("Volumes: %v", err)
	}
	return got
}

// testVolumeLifecycle checks create (owner, mode, listing, duplicates,
// bad names), usage, and an idempotent delete that removes the tree.
func testVolumeLifecycle(t *testing.T, b storage.Backend) {
	v := volumesOf(t, b)
	path := createVolume(t, v, "data", 0)
	if path != v.VolumePath("data") {
		t.Errorf("CreateVolume path = %s, VolumePath = %s", path, v.VolumePath("data"))
	}
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != fs.ModeDir|0o755 {
		t.Errorf("volume top directory mode = %v, want drwxr-xr-x", st.Mode())
	}
	if sys := st.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (sys.Uid != volumeOwner || sys.Gid != volumeOwner) {
		t.Errorf("volume top directory owned by %d:%d, want %d:%d", sys.Uid, sys.Gid, volumeOwner, volumeOwner)
	}
	if _, err := v.CreateVolume(t.Context(), "data", storage.VolumeOptions{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("CreateVolume of an existing name = %v, want ErrAlreadyExists", err)
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := v.CreateVolume(t.Context(), bad, storage.VolumeOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CreateVolume(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	mustWrite(t, filepath.Join(path, "f"), strings.Repeat("v", 1<<20))
	syscall.Sync()
	if n, err := v.VolumeUsage(t.Context(), "data"); err != nil || n <= 0 {
		t.Errorf("VolumeUsage after writing 1 MiB = %d, %v; want > 0", n, err)
	}
	if _, err := v.VolumeUsage(t.Context(), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("VolumeUsage of a missing volume = %v, want ErrNotFound", err)
	}
	createVolume(t, v, "other", 0)
	if diff := cmp.Diff([]string{"data", "other"}, volumeNames(t, v)); diff != "" {
		t.Errorf("Volumes (-want +got):\n%s", diff)
	}
	for range 2 {
		if err := v.DeleteVolume(t.Context(), "data"); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("deleted volume left %s: %v", path, err)
	}
	if diff := cmp.Diff([]string{"other"}, volumeNames(t, v)); diff != "" {
		t.Errorf("Volumes after delete (-want +got):\n%s", diff)
	}
}

// testVolumeCopy checks that a copy holds the source's files and that the
// two change apart afterwards.
func testVolumeCopy(t *testing.T, b storage.Backend) {
	v := volumesOf(t, b)
	src := createVolume(t, v, "src", 0)
	mustWrite(t, filepath.Join(src, "shared"), "before")
	if err := os.Mkdir(filepath.Join(src, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	dst, err := v.CopyVolume(t.Context(), "src", "dst")
	if err != nil {
		t.Fatalf("CopyVolume: %v", err)
	}
	t.Cleanup(func() { _ = v.DeleteVolume(context.Background(), "dst") })
	if got := readFile(t, filepath.Join(dst, "shared")); got != "before" {
		t.Errorf("copy reads %q, want %q", got, "before")
	}
	if st, err := os.Lstat(filepath.Join(dst, "dir")); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("copy's dir: %v, %v; want mode 0700", st, err)
	}
	mustWrite(t, filepath.Join(dst, "shared"), "copy")
	mustWrite(t, filepath.Join(src, "new"), "src only")
	if got := readFile(t, filepath.Join(src, "shared")); got != "before" {
		t.Errorf("writing the copy changed the source: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(dst, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file written to the source appears in the copy: %v", err)
	}
	if _, err := v.CopyVolume(t.Context(), "src", "dst"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("CopyVolume onto an existing volume = %v, want ErrAlreadyExists", err)
	}
	if _, err := v.CopyVolume(t.Context(), "missing", "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CopyVolume of a missing volume = %v, want ErrNotFound", err)
	}
	if diff := cmp.Diff([]string{"dst", "src"}, volumeNames(t, v)); diff != "" {
		t.Errorf("Volumes (-want +got):\n%s", diff)
	}
}

// testVolumeLimit checks that a backend with Capabilities.VolumeLimit
// stops writes past a volume's size with EDQUOT or ENOSPC, in the volume
// and in a copy of it, and that one without refuses a size with
// ErrNotImplemented and leaves nothing behind.
func testVolumeLimit(t *testing.T, b storage.Backend, caps Capabilities) {
	v := volumesOf(t, b)
	const limit = 16 << 20
	if !caps.VolumeLimit {
		_, err := v.CreateVolume(t.Context(), "limited", storage.VolumeOptions{SizeBytes: limit})
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatalf("CreateVolume with a size = %v, want ErrNotImplemented (no Capabilities.VolumeLimit)", err)
		}
		if got := volumeNames(t, v); len(got) != 0 {
			t.Errorf("Volumes after a refused size = %v, want none", got)
		}
		return
	}
	path := createVolume(t, v, "limited", limit)
	mustWrite(t, filepath.Join(path, "small"), strings.Repeat("s", 1<<20))
	checkFull(t, filepath.Join(path, "big"), limit)
	if err := os.Remove(filepath.Join(path, "big")); err != nil {
		t.Fatal(err)
	}
	cp, err := v.CopyVolume(t.Context(), "limited", "copy")
	if err != nil {
		t.Fatalf("CopyVolume: %v", err)
	}
	t.Cleanup(func() { _ = v.DeleteVolume(context.Background(), "copy") })
	checkFull(t, filepath.Join(cp, "big"), limit)
}

// checkFull fails t unless writing to path stops with EDQUOT or ENOSPC
// before limit bytes.
func checkFull(t *testing.T, path string, limit int64) {
	t.Helper()
	written, err := fillUntilError(path, 4*limit)
	if err == nil {
		t.Fatalf("wrote %d bytes into a volume limited to %d", written, limit)
	}
	if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past the size failed with %v, want EDQUOT or ENOSPC", err)
	}
	if written > limit {
		t.Errorf("wrote %d bytes before the size of %d bit", written, limit)
	}
}

// testRestartKeepsVolumes checks that a volume and its files survive a
// reopen.
func testRestartKeepsVolumes(t *testing.T, b storage.Backend, reopen Reopen) {
	v := volumesOf(t, b)
	path := createVolume(t, v, "keep", 0)
	mustWrite(t, filepath.Join(path, "f"), "kept")
	v = volumesOf(t, reopen(t, b))
	if diff := cmp.Diff([]string{"keep"}, volumeNames(t, v)); diff != "" {
		t.Errorf("Volumes after restart (-want +got):\n%s", diff)
	}
	if got := readFile(t, filepath.Join(v.VolumePath("keep"), "f")); got != "kept" {
		t.Errorf("volume file after restart = %q", got)
	}
}
