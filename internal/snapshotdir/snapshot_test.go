package snapshotdir

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// readTree describes the files under dir: path -> "dir", "link:<target>"
// or the content of a regular file.
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case fi.IsDir():
			out[rel] = "dir"
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link:" + target
		default:
			b, _ := os.ReadFile(p)
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestChangesReplayOverlay saves a real overlayfs upper layer (with a
// whiteout and an opaque directory) and replays it on a fresh overlay of
// the same lower tree: the merged views must match.
func TestChangesReplayOverlay(t *testing.T) {
	testutil.RequiresRoot(t)
	base := t.TempDir()
	lower := filepath.Join(base, "lower")
	write(t, filepath.Join(lower, "keep"), "keep")
	write(t, filepath.Join(lower, "gone"), "gone")
	write(t, filepath.Join(lower, "replaced/old"), "old")
	write(t, filepath.Join(lower, "etc/conf"), "v1")
	mount := func(name string) (merged, upper string) {
		upper, work, merged := filepath.Join(base, name, "upper"), filepath.Join(base, name, "work"), filepath.Join(base, name, "merged")
		for _, d := range []string{upper, work, merged} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opt := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",index=off,metacopy=off,redirect_dir=off"
		if err := unix.Mount("overlay", merged, "overlay", 0, opt); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
		return merged, upper
	}
	src, upper := mount("a")
	write(t, filepath.Join(src, "etc/conf"), "v2")
	write(t, filepath.Join(src, "new/deep/file"), "new")
	if err := os.Remove(filepath.Join(src, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(src, "replaced")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "replaced/fresh"), "fresh")
	if err := os.Symlink("../keep", filepath.Join(src, "new/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "new/deep/file"), filepath.Join(src, "new/hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "new/deep/file"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "new/deep"), mtime, mtime); err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	if err := WriteChanges(t.Context(), &buf, upper); err != nil {
		t.Fatal(err)
	}
	dst, _ := mount("b")
	if err := Apply(t.Context(), &buf, dst); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(readTree(t, src), readTree(t, dst)); diff != "" {
		t.Fatalf("replayed tree (-source +replay):\n%s", diff)
	}
	var a, b unix.Stat_t
	_ = unix.Stat(filepath.Join(dst, "new/deep/file"), &a)
	_ = unix.Stat(filepath.Join(dst, "new/hard"), &b)
	if a.Ino != b.Ino || a.Mode&07777 != 0o4755 {
		t.Errorf("hard link or setuid mode lost: inodes %d %d, mode %o", a.Ino, b.Ino, a.Mode&07777)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "new/deep")); !fi.ModTime().Equal(mtime) {
		t.Errorf("directory time %v, want %v", fi.ModTime(), mtime)
	}
}

// TestApplyStaysInRoot replays hostile streams: a path with "..", and an
// entry written through a symlink that the stream itself planted.
func TestApplyStaysInRoot(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
	}{
		{"dotdot", []*tar.Header{{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"symlink", []*tar.Header{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		}},
		{"hardlink", []*tar.Header{{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			err := Apply(t.Context(), &buf, t.TempDir())
			if err == nil {
				t.Fatal("hostile stream applied without error")
			}
			if _, err := os.Lstat(filepath.Join(outside, "escaped")); err == nil {
				t.Fatal("a file was written outside the root")
			}
		})
	}
}

func TestSealVerify(t *testing.T) {
	parent := t.TempDir()
	tmp, err := TempDir(parent, "s")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(tmp, ChangesName), "files")
	write(t, filepath.Join(tmp, MemoryDir, "pages"), strings.Repeat("p", 5000))
	m, err := Seal(tmp, map[string]string{"name": "s"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 2 || m.Files["memory/pages"].Size != 5000 {
		t.Fatalf("manifest %+v", m)
	}
	final := filepath.Join(parent, "s")
	if err := Publish(tmp, final); err != nil {
		t.Fatal(err)
	}
	got, err := Verify(final)
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]string
	if err := json.Unmarshal(got.Info, &info); err != nil || info["name"] != "s" {
		t.Fatalf("info %s: %v", got.Info, err)
	}
	damage := []struct {
		name string
		do   func(dir string)
		want string
	}{
		{"flipped byte", func(dir string) { write(t, filepath.Join(dir, ChangesName), "filez") }, "files.tar has size"},
		{"missing file", func(dir string) { os.Remove(filepath.Join(dir, MemoryDir, "pages")) }, "missing"},
		{"extra file", func(dir string) { write(t, filepath.Join(dir, "stray"), "x") }, "unexpected file stray"},
		{"no manifest", func(dir string) { os.Remove(filepath.Join(dir, ManifestName)) }, "damaged"},
	}
	for _, tc := range damage {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "s")
			if err := CopyTree(t.Context(), final, mkdir(t, dir)); err != nil {
				t.Fatal(err)
			}
			tc.do(dir)
			_, err := Verify(dir)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v, want failed precondition mentioning %q", err, tc.want)
			}
		})
	}
	if err := Publish(tmp, final); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("publishing over a snapshot: %v", err)
	}
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCleanAndRemove(t *testing.T) {
	parent := t.TempDir()
	for _, d := range []string{".tmp-a-1", ".del-b-2", "kept", "gone"} {
		mkdir(t, filepath.Join(parent, d, "x"))
	}
	names, err := Clean(parent)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gone", "kept"}, names); diff != "" {
		t.Fatalf("Clean (-want +got):\n%s", diff)
	}
	if err := Remove(filepath.Join(parent, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := Remove(filepath.Join(parent, "gone")); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if left, _ := os.ReadDir(parent); len(left) != 1 || left[0].Name() != "kept" {
		t.Fatalf("left %v", left)
	}
	if names, err := Clean(filepath.Join(parent, "missing")); err != nil || names != nil {
		t.Fatalf("Clean of a missing directory: %v %v", names, err)
	}
}
