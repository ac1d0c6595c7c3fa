package untar_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/untar"
)

// member is one tar entry for the archives these tests build.
type member struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func file(name, body string, mode int64) member {
	return member{name: name, body: body, typ: tar.TypeReg, mode: mode}
}
func dir(name string, mode int64) member { return member{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

var testMtime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func tarball(t testing.TB, members ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		hdr := &tar.Header{
			Name: m.name, Linkname: m.link, Typeflag: m.typ, Mode: m.mode,
			Uid: m.uid, Gid: m.gid, ModTime: testMtime, Size: int64(len(m.body)),
			Format: tar.FormatPAX,
		}
		if m.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("writing header %q: %v", m.name, err)
		}
		if _, err := io.WriteString(tw, m.body); err != nil {
			t.Fatalf("writing body %q: %v", m.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readLink(t *testing.T, p string) string {
	t.Helper()
	s, err := os.Readlink(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lstat(t *testing.T, p string) fs.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestExtractTar(t *testing.T) {
	tree := []member{
		dir("./", 0o755),
		dir("./etc/", 0o755),
		file("./etc/hostname", "box\n", 0o644),
		symlink("./etc/localtime", "/usr/share/zoneinfo/UTC"),
		dir("./usr/bin/", 0o755),
		file("./usr/bin/tool", "#!/bin/sh\n", 0o755),
		hardlink("./usr/bin/tool2", "./usr/bin/tool"),
		symlink("./bin", "usr/bin"),
		file("./bin/via-link", "in usr/bin", 0o644), // through a symlink that stays inside
		file("deep/no/parents", "x", 0o600),
	}
	checkTree := func(t *testing.T, root string) {
		if got := readFile(t, filepath.Join(root, "etc/hostname")); got != "box\n" {
			t.Errorf("etc/hostname = %q", got)
		}
		if got := readLink(t, filepath.Join(root, "etc/localtime")); got != "/usr/share/zoneinfo/UTC" {
			t.Errorf("etc/localtime -> %q", got)
		}
		if got := readLink(t, filepath.Join(root, "bin")); got != "usr/bin" {
			t.Errorf("bin -> %q", got)
		}
		if got := readFile(t, filepath.Join(root, "usr/bin/via-link")); got != "in usr/bin" {
			t.Errorf("usr/bin/via-link = %q", got)
		}
		tool, tool2 := lstat(t, filepath.Join(root, "usr/bin/tool")), lstat(t, filepath.Join(root, "usr/bin/tool2"))
		if !os.SameFile(tool, tool2) {
			t.Errorf("usr/bin/tool2 is not a hard link of usr/bin/tool")
		}
		if tool.Mode() != 0o755 {
			t.Errorf("usr/bin/tool mode = %v", tool.Mode())
		}
		if !tool.ModTime().Equal(testMtime) {
			t.Errorf("usr/bin/tool mtime = %v, want %v", tool.ModTime(), testMtime)
		}
		if fi := lstat(t, filepath.Join(root, "etc")); !fi.ModTime().Equal(testMtime) || fi.Mode() != fs.ModeDir|0o755 {
			t.Errorf("etc: mode %v mtime %v", fi.Mode(), fi.ModTime())
		}
		if fi := lstat(t, filepath.Join(root, "deep/no")); fi.Mode() != fs.ModeDir|0o755 {
			t.Errorf("implicit parent deep/no: mode %v", fi.Mode())
		}
		if fi := lstat(t, filepath.Join(root, "deep/no/parents")); fi.Mode() != 0o600 {
			t.Errorf("deep/no/parents: mode %v", fi.Mode())
		}
	}

	tests := []struct {
		name string
		// archive builds the tarball; outside is the sentinel directory's
		// absolute path, for archives that aim at it.
		archive func(t *testing.T, outside string) []byte
		wantErr error  // an errdefs kind, or errAny
		wantMsg string // a substring of the error
		check   func(t *testing.T, root, outside string)
	}{
		{
			name:    "tree",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, tree...) },
			check:   func(t *testing.T, root, _ string) { checkTree(t, root) },
		},
		{
			name:    "gzip",
			archive: func(t *testing.T, _ string) []byte { return gzipped(t, tarball(t, tree...)) },
			check:   func(t *testing.T, root, _ string) { checkTree(t, root) },
		},
		{
			name: "absolute names land inside",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, dir("/etc/", 0o755), file("/etc/abs", "a", 0o644), file(outside+"/file", "pwned", 0o644))
			},
			check: func(t *testing.T, root, outside string) {
				if got := readFile(t, filepath.Join(root, "etc/abs")); got != "a" {
					t.Errorf("etc/abs = %q", got)
				}
				if got := readFile(t, filepath.Join(root, outside, "file")); got != "pwned" {
					t.Errorf("%s/file inside root = %q", outside, got)
				}
			},
		},
		{
			name: "whiteouts are plain files",
			archive: func(t *testing.T, _ string) []byte {
				return tarball(t, file("foo", "kept", 0o644), file(".wh.foo", "", 0o644), dir("d/", 0o755), file("d/x", "x", 0o644), file("d/.wh..wh..opq", "", 0o644))
			},
			check: func(t *testing.T, root, _ string) {
				for _, p := range []string{"foo", ".wh.foo", "d/x", "d/.wh..wh..opq"} {
					lstat(t, filepath.Join(root, p))
				}
			},
		},
		{
			name:    "dotdot escape",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, file("x/../../y", "pwned", 0o644)) },
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `extracting entry "x/../../y": path escapes the rootfs: invalid argument`,
		},
		{
			name:    "dotdot into the sentinel",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, file("../outside/file", "pwned", 0o644)) },
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: "path escapes the rootfs",
		},
		{
			name:    "absolute dotdot",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, file("/../outside/new", "pwned", 0o644)) },
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: "path escapes the rootfs",
		},
		{
			name: "absolute symlink then write through it",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, symlink("etc", outside), file("etc/passwd", "pwned", 0o644))
			},
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `extracting entry "etc/passwd": path escapes the rootfs through symlink "etc" -> "`,
		},
		{
			name: "absolute symlink then overwrite the target file",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, symlink("etc", outside), file("etc/file", "pwned", 0o644))
			},
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name: "relative symlink escaping then write through it",
			archive: func(t *testing.T, _ string) []byte {
				return tarball(t, symlink("up", "../outside"), file("up/new", "pwned", 0o644))
			},
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `through symlink "up" -> "../outside"`,
		},
		{
			name: "symlink chain escaping",
			archive: func(t *testing.T, _ string) []byte {
				return tarball(t, dir("a/", 0o755), symlink("a/b", "../c"), symlink("c", "d/../../outside"), dir("d/", 0o755), file("a/b/new", "pwned", 0o644))
			},
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `through symlink "c" -> "d/../../outside"`,
		},
		{
			name: "directory through escaping symlink",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, symlink("l", outside), dir("l/sub/", 0o777))
			},
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name: "symlink through escaping symlink",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, symlink("l", outside), symlink("l/evil", "/"))
			},
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name:    "hard link to outside",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, hardlink("h", "../outside/file")) },
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `extracting entry "h": hard link target "../outside/file": path escapes the rootfs`,
		},
		{
			name: "hard link through escaping symlink",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, symlink("l", outside), hardlink("h", "l/file"))
			},
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: `through symlink "l"`,
		},
		{
			name: "hard link to absolute name stays inside",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t, hardlink("h", outside+"/file"))
			},
			wantErr: fs.ErrNotExist, // the member does not exist inside the root
		},
		{
			name: "later entries replace earlier ones",
			archive: func(t *testing.T, outside string) []byte {
				return tarball(t,
					file("a", "one", 0o644), file("a", "two", 0o600),
					file("b", "file", 0o644), dir("b/", 0o700), file("b/x", "x", 0o644),
					dir("c/", 0o755), file("c/x", "x", 0o644), file("c", "now a file", 0o644),
					symlink("d", outside+"/file"), file("d", "not through the link", 0o644),
					file("e", "e", 0o644), symlink("e", "a"),
					file("f", "f", 0o644), hardlink("g", "f"), file("f", "new f", 0o644),
					symlink("h", outside), file("h", "not into the linked directory", 0o644),
					symlink("i", "../outside"), dir("i/", 0o700),
				)
			},
			check: func(t *testing.T, root, _ string) {
				if got := readFile(t, filepath.Join(root, "a")); got != "two" {
					t.Errorf("a = %q", got)
				}
				if fi := lstat(t, filepath.Join(root, "a")); fi.Mode() != 0o600 {
					t.Errorf("a mode = %v", fi.Mode())
				}
				if fi := lstat(t, filepath.Join(root, "b")); fi.Mode() != fs.ModeDir|0o700 {
					t.Errorf("b mode = %v", fi.Mode())
				}
				if got := readFile(t, filepath.Join(root, "c")); got != "now a file" {
					t.Errorf("c = %q", got)
				}
				if got := readFile(t, filepath.Join(root, "d")); got != "not through the link" {
					t.Errorf("d = %q", got)
				}
				if got := readLink(t, filepath.Join(root, "e")); got != "a" {
					t.Errorf("e -> %q", got)
				}
				if got := readFile(t, filepath.Join(root, "f")); got != "new f" {
					t.Errorf("f = %q", got)
				}
				if got := readFile(t, filepath.Join(root, "g")); got != "f" {
					t.Errorf("g (old hard link of f) = %q", got)
				}
				if got := readFile(t, filepath.Join(root, "h")); got != "not into the linked directory" {
					t.Errorf("h = %q", got)
				}
				if fi := lstat(t, filepath.Join(root, "i")); fi.Mode() != fs.ModeDir|0o700 {
					t.Errorf("i mode = %v, want a directory replacing the symlink", fi.Mode())
				}
			},
		},
		{
			name: "special modes",
			archive: func(t *testing.T, _ string) []byte {
				return tarball(t, file("su", "", 0o4755), file("sg", "", 0o2711), dir("tmp/", 0o1777), dir("ro/", 0o555), file("ro/f", "f", 0o400))
			},
			check: func(t *testing.T, root, _ string) {
				want := map[string]fs.FileMode{
					"su":   fs.ModeSetuid | 0o755,
					"sg":   fs.ModeSetgid | 0o711,
					"tmp":  fs.ModeDir | fs.ModeSticky | 0o777,
					"ro":   fs.ModeDir | 0o555,
					"ro/f": 0o400,
				}
				for p, m := range want {
					if got := lstat(t, filepath.Join(root, p)).Mode(); got != m {
						t.Errorf("%s mode = %v, want %v", p, got, m)
					}
				}
			},
		},
		{
			name: "devices and fifos are skipped",
			archive: func(t *testing.T, _ string) []byte {
				return tarball(t, dir("dev/", 0o755),
					member{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
					member{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
					member{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
					file("after", "still extracted", 0o644))
			},
			check: func(t *testing.T, root, _ string) {
				for _, p := range []string{"dev/null", "dev/sda", "run/fifo"} {
					if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s: err = %v, want not exist", p, err)
					}
				}
				if got := readFile(t, filepath.Join(root, "after")); got != "still extracted" {
					t.Errorf("after = %q", got)
				}
			},
		},
		{
			name:    "file replacing the root",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, file(".", "x", 0o644)) },
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name:    "unsupported type",
			archive: func(t *testing.T, _ string) []byte { return tarball(t, member{name: "v", typ: 'V'}) },
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: "unsupported entry type",
		},
		{
			name: "truncated",
			archive: func(t *testing.T, _ string) []byte {
				data := tarball(t, file("big", strings.Repeat("x", 4096), 0o644))
				return data[:1024]
			},
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name:    "not a tarball",
			archive: func(t *testing.T, _ string) []byte { return bytes.Repeat([]byte("not a tar file\n"), 100) },
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name:    "corrupt gzip",
			archive: func(t *testing.T, _ string) []byte { return gzipped(t, tarball(t, tree...))[:40] },
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name: "gzip checksum",
			archive: func(t *testing.T, _ string) []byte {
				data := gzipped(t, tarball(t, tree...))
				data[len(data)-8] ^= 0xff // CRC-32 of the trailer
				return data
			},
			wantErr: errdefs.ErrInvalidArgument,
			wantMsg: "checksum",
		},
		{
			name:    "zstd",
			archive: func(t *testing.T, _ string) []byte { return []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0} },
			wantErr: errdefs.ErrNotImplemented,
			wantMsg: "zstd-compressed tarballs are not supported",
		},
		{
			name:    "empty stream",
			archive: func(t *testing.T, _ string) []byte { return nil },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, outside, before := testutil.SandboxDirs(t)
			err := untar.ExtractTar(t.Context(), bytes.NewReader(tc.archive(t, outside)), root)
			if err != nil {
				t.Logf("ExtractTar: %v", err)
			}
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("ExtractTar: %v", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("ExtractTar error = %v, want one wrapping %v", err, tc.wantErr)
			case tc.wantMsg != "" && !strings.Contains(fmt.Sprint(err), tc.wantMsg):
				t.Errorf("ExtractTar error = %q, want it to contain %q", err, tc.wantMsg)
			}
			if diff := cmp.Diff(before, testutil.SnapshotOutside(t, filepath.Dir(root))); diff != "" {
				t.Errorf("files outside the root changed (-before +after):\n%s", diff)
			}
			if tc.check != nil {
				tc.check(t, root, outside)
			}
		})
	}
}

// TestExtractTarRefusesSparse feeds GNU tar's sparse encodings of a 1 GiB
// hole: 10 KiB of archive that would otherwise become 1 GiB of zeros.
func TestExtractTarRefusesSparse(t *testing.T) {
	tarBin := testutil.RequiresBinary(t, "tar")
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, format := range []string{"posix", "gnu"} {
		t.Run(format, func(t *testing.T) {
			data, err := exec.Command(tarBin, "--sparse", "--format="+format, "-C", src, "-cf", "-", "bomb").Output()
			if err != nil {
				t.Fatalf("tar: %v", err)
			}
			root, _, _ := testutil.SandboxDirs(t)
			err = untar.ExtractTar(t.Context(), bytes.NewReader(data), root)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "sparse") {
				t.Fatalf("ExtractTar error = %v, want invalid argument about sparse files", err)
			}
		})
	}
}

func TestExtractTarOwnership(t *testing.T) {
	testutil.RequiresRoot(t)
	root, _, _ := testutil.SandboxDirs(t)
	data := tarball(t,
		member{name: "d/", typ: tar.TypeDir, mode: 0o750, uid: 1234, gid: 5678},
		member{name: "d/su", typ: tar.TypeReg, mode: 0o4755, uid: 1000, gid: 1001, body: "x"},
		member{name: "d/link", typ: tar.TypeSymlink, link: "su", mode: 0o777, uid: 42, gid: 43},
	)
	if err := untar.ExtractTar(t.Context(), bytes.NewReader(data), root); err != nil {
		t.Fatalf("ExtractTar: %v", err)
	}
	got := map[string]string{}
	for _, p := range []string{"d", "d/su", "d/link"} {
		fi := lstat(t, filepath.Join(root, p))
		st := fi.Sys().(*syscall.Stat_t)
		got[p] = fmt.Sprintf("%d:%d", st.Uid, st.Gid)
		if p == "d/su" && fi.Mode() != fs.ModeSetuid|0o755 {
			t.Errorf("d/su mode = %v: setuid must survive chown", fi.Mode())
		}
	}
	want := map[string]string{"d": "1234:5678", "d/su": "1000:1001", "d/link": "42:43"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ownership (-want +got):\n%s", diff)
	}
}

// patternReader yields n bytes of a repeating pattern without holding them.
type patternReader struct{ n int64 }

func (r *patternReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	for i := range p {
		p[i] = byte(i % 251)
	}
	r.n -= int64(len(p))
	return len(p), nil
}

func TestExtractTarStreamsHugeFile(t *testing.T) {
	const size = 64 << 20
	root, _, _ := testutil.SandboxDirs(t)
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
		if err == nil {
			_, err = io.Copy(tw, &patternReader{n: size})
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := untar.ExtractTar(t.Context(), pr, root)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("ExtractTar: %v", err)
	}
	if fi := lstat(t, filepath.Join(root, "huge")); fi.Size() != size {
		t.Errorf("huge is %d bytes, want %d", fi.Size(), size)
	}
	// Allocations of both the writer goroutine and ExtractTar: a few copy
	// buffers, far below the file's size.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d KiB", alloc>>10)
	if alloc > 4<<20 {
		t.Errorf("extracting a %d MiB file allocated %d KiB; it must stream", size>>20, alloc>>10)
	}
}

func TestExtractTarCanceled(t *testing.T) {
	root, _, _ := testutil.SandboxDirs(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := untar.ExtractTar(ctx, bytes.NewReader(tarball(t, file("a", "a", 0o644))), root)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ExtractTar error = %v, want context.Canceled", err)
	}
}

// fuzzAbsSentinel is a fixed absolute path that fuzz seeds aim absolute
// symlinks at. It must never exist: ExtractTar may not create anything
// through such a link.
var fuzzAbsSentinel = filepath.Join(os.TempDir(), "corral-extract-fuzz-sentinel")

func FuzzExtractTar(f *testing.F) {
	abs := fuzzAbsSentinel
	seeds := [][]member{
		{file("x/../../y", "p", 0o644)},
		{file("../outside/file", "p", 0o644)},
		{file("/../outside/new", "p", 0o644)},
		{symlink("etc", abs), file("etc/passwd", "p", 0o644)},
		{symlink("etc", abs), dir("etc/sub/", 0o755)},
		{symlink("etc", abs+"/"), symlink("etc/l", "/")},
		{symlink("up", "../outside"), file("up/new", "p", 0o644), file("up/file", "p", 0o644)},
		{symlink("a", "b"), symlink("b", "../outside"), file("a/file", "p", 0o600)},
		{hardlink("h", "../outside/file")},
		{symlink("l", "../outside"), hardlink("h", "l/file")},
		{symlink("l", "../outside/file"), dir("l/", 0o777)},
		{symlink("l", "../outside/file"), file("l", "replaced, not written through", 0o777)},
		{dir("d/", 0o755), symlink("d/s", "../../outside"), file("d/s/new", "p", 0o644)},
		{dir("./", 0o700), file("./ok", "fine", 0o4755), hardlink("ok2", "/ok")},
		{symlink("h", abs), file("h", "replaces the link", 0o644), symlink("i", "../outside"), dir("i/", 0o700)},
	}
	for _, s := range seeds {
		data := tarball(f, s...)
		f.Add(data)
		f.Add(gzipped(f, data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		root, _, before := testutil.SandboxDirs(t)
		untar.ExtractTar(t.Context(), bytes.NewReader(data), root)
		if diff := cmp.Diff(before, testutil.SnapshotOutside(t, filepath.Dir(root))); diff != "" {
			t.Fatalf("files outside the root changed (-before +after):\n%s", diff)
		}
		if _, err := os.Lstat(abs); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s was created through the archive (lstat err %v)", abs, err)
		}
	})
}

// TestExtractTarLimit: a gzip far smaller than the limit that unpacks to
// more is refused with ErrTooLarge; a stream exactly at the limit passes.
func TestExtractTarLimit(t *testing.T) {
	big := tarball(t, file("zeros", strings.Repeat("\x00", 1<<20), 0o644))
	small := gzipped(t, big)
	if len(small) > 64<<10 {
		t.Fatalf("the gzip is %d bytes; the test wants it small", len(small))
	}
	root, _, _ := testutil.SandboxDirs(t)
	err := untar.ExtractTarLimit(t.Context(), bytes.NewReader(small), root, 256<<10)
	if !errors.Is(err, untar.ErrTooLarge) {
		t.Fatalf("ExtractTarLimit error = %v, want ErrTooLarge", err)
	}
	root2, _, _ := testutil.SandboxDirs(t)
	if err := untar.ExtractTarLimit(t.Context(), bytes.NewReader(small), root2, int64(len(big))); err != nil {
		t.Fatalf("a stream at the limit: %v", err)
	}
}
