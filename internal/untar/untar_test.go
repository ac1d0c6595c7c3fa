package untar_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/untar"
)

var mtime = time.Date(2023, 3, 4, 5, 6, 7, 0, time.UTC)

// ent is one entry handed to a Writer: a header and the file's contents.
type ent struct {
	hdr  tar.Header
	body string
}

func reg(name, body string, mode int64) ent {
	return ent{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: mtime}, body}
}

func mkdir(name string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: mtime}}
}

func link(typ byte, name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: typ, Name: name, Linkname: target, Mode: 0o777, ModTime: mtime}}
}

// setup makes base/outside/sentinel next to base/root, opens a Writer on
// root and returns it with both paths. The test fails at its end if
// anything next to root changed.
func setup(t *testing.T) (w *untar.Writer, root *os.Root, dir, outside string) {
	t.Helper()
	base := t.TempDir()
	dir, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{dir, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "sentinel"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		root.Close()
		var got []string
		filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if p == dir {
				return filepath.SkipDir
			}
			got = append(got, strings.TrimPrefix(p, base))
			return err
		})
		want := []string{"", "/outside", "/outside/sentinel"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("paths next to the root changed (-want +got):\n%s", diff)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "sentinel")); err != nil || string(b) != "keep" {
			t.Errorf("sentinel = %q, %v; want it untouched", b, err)
		}
	})
	return untar.NewWriter(root, make([]byte, 4096)), root, dir, outside
}

// write hands the entries to w in order and returns the first error, with
// the entry's name.
func write(ctx context.Context, w *untar.Writer, ents ...ent) error {
	for _, e := range ents {
		if _, err := w.Entry(ctx, &e.hdr, strings.NewReader(e.body)); err != nil {
			return fmt.Errorf("entry %q: %w", e.hdr.Name, err)
		}
	}
	return nil
}

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		escapes  bool
	}{
		{in: "", want: "."},
		{in: "/", want: "."},
		{in: "./", want: "."},
		{in: "a/b/", want: "a/b"},
		{in: "//etc/./passwd", want: "etc/passwd"},
		{in: "a/../b", want: "b"},
		{in: "/../etc", escapes: true},
		{in: "..", escapes: true},
		{in: "a/../../b", escapes: true},
		{in: "..foo", want: "..foo"},
	}
	for _, tc := range tests {
		got, err := untar.CleanName(tc.in)
		if tc.escapes {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("CleanName(%q) = %q, %v; want an invalid argument", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("CleanName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestWriterRefuses(t *testing.T) {
	sparse := reg("sparse", "x", 0o644)
	sparse.hdr.PAXRecords = map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
	tests := []struct {
		name string
		// ents get "OUT" in link targets replaced by the absolute path of
		// the directory next to the root. The last entry must fail.
		ents    []ent
		wantMsg string
	}{
		{
			name:    "dot-dot name",
			ents:    []ent{reg("a/../../outside/evil", "x", 0o644)},
			wantMsg: `entry "a/../../outside/evil": path escapes the rootfs`,
		},
		{
			name:    "file through an absolute symlink",
			ents:    []ent{link(tar.TypeSymlink, "l", "OUT"), reg("l/evil", "x", 0o644)},
			wantMsg: `entry "l/evil": path escapes the rootfs through symlink "l" -> "`,
		},
		{
			name:    "directory through a relative symlink that climbs out",
			ents:    []ent{link(tar.TypeSymlink, "up", "../outside"), mkdir("up/sub", 0o777)},
			wantMsg: `entry "up/sub": path escapes the rootfs through symlink "up" -> "../outside"`,
		},
		{
			name:    "symlink through a chain of symlinks",
			ents:    []ent{mkdir("d", 0o755), link(tar.TypeSymlink, "a", "d/b"), link(tar.TypeSymlink, "d/b", "../../outside"), link(tar.TypeSymlink, "a/evil", "/")},
			wantMsg: `through symlink "d/b" -> "../../outside"`,
		},
		{
			name:    "hard link outside the root by name",
			ents:    []ent{link(tar.TypeLink, "hl", "../outside/sentinel")},
			wantMsg: `entry "hl": hard link target "../outside/sentinel": path escapes the rootfs`,
		},
		{
			name:    "hard link outside the root through a symlink",
			ents:    []ent{link(tar.TypeSymlink, "l", "OUT"), link(tar.TypeLink, "hl", "l/sentinel")},
			wantMsg: `entry "hl": path escapes the rootfs through symlink "l"`,
		},
		{
			name:    "hard link placed through a symlink",
			ents:    []ent{reg("f", "f", 0o644), link(tar.TypeSymlink, "l", "../outside"), link(tar.TypeLink, "l/hl", "f")},
			wantMsg: `entry "l/hl": path escapes the rootfs through symlink "l"`,
		},
		{
			name:    "file replacing the root",
			ents:    []ent{reg("/", "x", 0o644)},
			wantMsg: `entry "/": entry would replace the rootfs directory itself`,
		},
		{
			name:    "symlink replacing the root",
			ents:    []ent{link(tar.TypeSymlink, ".", "OUT")},
			wantMsg: `would replace the rootfs directory itself`,
		},
		{
			name:    "hard link replacing the root",
			ents:    []ent{reg("f", "f", 0o644), link(tar.TypeLink, "./", "f")},
			wantMsg: `would replace the rootfs directory itself`,
		},
		{
			name:    "symlink with an empty target",
			ents:    []ent{link(tar.TypeSymlink, "l", "")},
			wantMsg: `symlink has an empty target`,
		},
		{
			name:    "PAX sparse file",
			ents:    []ent{sparse},
			wantMsg: `sparse files are not supported`,
		},
		{
			name:    "GNU sparse file",
			ents:    []ent{{hdr: tar.Header{Typeflag: tar.TypeGNUSparse, Name: "s"}}},
			wantMsg: `sparse files are not supported`,
		},
		{
			name:    "unsupported type",
			ents:    []ent{{hdr: tar.Header{Typeflag: 'V', Name: "v"}}},
			wantMsg: `unsupported entry type 'V'`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, _, _, outside := setup(t)
			for i := range tc.ents {
				tc.ents[i].hdr.Linkname = strings.ReplaceAll(tc.ents[i].hdr.Linkname, "OUT", outside)
			}
			last := len(tc.ents) - 1
			if err := write(t.Context(), w, tc.ents[:last]...); err != nil {
				t.Fatalf("entries before the last: %v", err)
			}
			err := write(t.Context(), w, tc.ents[last])
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error = %v, want one wrapping ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tc.wantMsg)
			}
			if err := w.Finish(); err != nil {
				t.Errorf("Finish: %v", err)
			}
		})
	}
}

// TestWriterDirModesAfterContents checks that directories stay writable
// until Finish, so read-only directories can be filled, and that Finish
// applies the last entry's mode and times.
func TestWriterDirModesAfterContents(t *testing.T) {
	w, _, dir, _ := setup(t)
	late := mkdir("late", 0o700)
	late.hdr.ModTime = mtime.Add(time.Hour)
	err := write(t.Context(), w,
		mkdir(".", 0o751),
		mkdir("ro", 0o555), reg("ro/f", "f", 0o400), mkdir("ro/sub", 0o500), reg("ro/sub/g", "g", 0o444),
		mkdir("late", 0o755), reg("late/x", "x", 0o644), late,
		mkdir("gone", 0o555), reg("gone", "now a file", 0o640),
		mkdir("tmp", 0o1777),
	)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "ro")); err != nil || fi.Mode() != fs.ModeDir|0o700 {
		t.Fatalf("ro before Finish: %v, %v; want owner-only until Finish", fi.Mode(), err)
	}
	if err := w.Finish(); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	want := map[string]string{
		".":        fmt.Sprintf("%v %d", fs.ModeDir|0o751, mtime.Unix()),
		"ro":       fmt.Sprintf("%v %d", fs.ModeDir|0o555, mtime.Unix()),
		"ro/f":     fmt.Sprintf("%v %d", fs.FileMode(0o400), mtime.Unix()),
		"ro/sub":   fmt.Sprintf("%v %d", fs.ModeDir|0o500, mtime.Unix()),
		"ro/sub/g": fmt.Sprintf("%v %d", fs.FileMode(0o444), mtime.Unix()),
		"late":     fmt.Sprintf("%v %d", fs.ModeDir|0o700, mtime.Add(time.Hour).Unix()),
		"late/x":   fmt.Sprintf("%v %d", fs.FileMode(0o644), mtime.Unix()),
		"gone":     fmt.Sprintf("%v %d", fs.FileMode(0o640), mtime.Unix()),
		"tmp":      fmt.Sprintf("%v %d", fs.ModeDir|fs.ModeSticky|0o777, mtime.Unix()),
	}
	got := map[string]string{}
	for p := range want {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		got[p] = fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().Unix())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("modes and mtimes (-want +got):\n%s", diff)
	}
}

func TestWriterReplaces(t *testing.T) {
	w, _, dir, outside := setup(t)
	err := write(t.Context(), w,
		reg("a", "one", 0o644), reg("a", "two", 0o600),
		link(tar.TypeSymlink, "s", outside+"/sentinel"), reg("s", "not through the link", 0o644),
		link(tar.TypeSymlink, "d", "../outside"), mkdir("d", 0o755), reg("d/x", "x", 0o644),
		reg("f", "f", 0o644), link(tar.TypeLink, "g", "/f"), link(tar.TypeLink, "g", "g"),
		link(tar.TypeSymlink, "abs", "/usr/bin/python3"),
	)
	if err == nil {
		err = w.Finish()
	}
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"a": "two", "s": "not through the link", "d/x": "x", "g": "f"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	f, _ := os.Lstat(filepath.Join(dir, "f"))
	if g, err := os.Lstat(filepath.Join(dir, "g")); err != nil || !os.SameFile(f, g) {
		t.Errorf("g is not a hard link of f (%v)", err)
	}
	if got, err := os.Readlink(filepath.Join(dir, "abs")); err != nil || got != "/usr/bin/python3" {
		t.Errorf("abs -> %q, %v; want the target stored as it is", got, err)
	}
}

func TestWriterSkipsDevices(t *testing.T) {
	w, _, dir, _ := setup(t)
	for _, typ := range []byte{tar.TypeChar, tar.TypeBlock, tar.TypeFifo} {
		hdr := &tar.Header{Typeflag: typ, Name: "dev/x", Mode: 0o666}
		wrote, err := w.Entry(t.Context(), hdr, strings.NewReader(""))
		if wrote || err != nil {
			t.Errorf("type %q: wrote %v, err %v; want skipped", typ, wrote, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dev: %v, want nothing created", err)
	}
	wrote, err := w.Entry(t.Context(), &tar.Header{Typeflag: tar.TypeReg, Name: "f"}, strings.NewReader(""))
	if !wrote || err != nil {
		t.Errorf("regular file: wrote %v, err %v", wrote, err)
	}
}

func TestWriterOwnership(t *testing.T) {
	testutil.RequiresRoot(t)
	w, _, dir, _ := setup(t)
	owned := func(e ent, uid, gid int) ent {
		e.hdr.Uid, e.hdr.Gid = uid, gid
		return e
	}
	err := write(t.Context(), w,
		owned(mkdir("d", 0o750), 1234, 5678),
		owned(reg("d/su", "x", 0o4755), 1000, 1001),
		owned(link(tar.TypeSymlink, "d/l", "su"), 42, 43),
	)
	if err == nil {
		err = w.Finish()
	}
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range []string{"d", "d/su", "d/l"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		got[p] = fmt.Sprintf("%d:%d %v", st.Uid, st.Gid, fi.Mode().Perm()|fi.Mode()&fs.ModeSetuid)
	}
	want := map[string]string{"d": "1234:5678 -rwxr-x---", "d/su": "1000:1001 urwxr-xr-x", "d/l": "42:43 -rwxrwxrwx"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("owners and modes (-want +got); setuid must survive chown:\n%s", diff)
	}
}

// cancelReader cancels its context once the first chunk has been read.
type cancelReader struct {
	cancel context.CancelFunc
	left   int
}

func (r *cancelReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	r.cancel()
	n := min(len(p), r.left)
	r.left -= n
	return n, nil
}

func TestWriterCanceledMidFile(t *testing.T) {
	w, _, _, _ := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	r := &cancelReader{cancel: cancel, left: 1 << 20}
	_, err := w.Entry(ctx, &tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 1 << 20}, r)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	if r.left != 1<<20-4096 {
		t.Errorf("read %d bytes after cancel, want one chunk", 1<<20-r.left)
	}
}

func TestStreamError(t *testing.T) {
	other := errors.New("disk on fire")
	for _, tc := range []struct {
		err     error
		invalid bool
	}{
		{tar.ErrHeader, true},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		{other, false},
		{context.Canceled, false},
	} {
		got := untar.StreamError(tc.err)
		if !errors.Is(got, tc.err) || errors.Is(got, errdefs.ErrInvalidArgument) != tc.invalid {
			t.Errorf("StreamError(%v) = %v, want it to wrap the error and be invalid = %v", tc.err, got, tc.invalid)
		}
	}
}
