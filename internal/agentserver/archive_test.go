package agentserver_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// sandboxBeside starts an agent whose Root is base/root and returns it with
// base/outside, a directory beside the root holding a secret file.
func sandboxBeside(t *testing.T) (a *testAgent, outside string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startAgentWith(t, agentserver.Options{Root: root}), outside
}

// treeEntry is what the tests compare of one file in a tree.
type treeEntry struct {
	Type     string
	Mode     fs.FileMode
	UID, GID uint32
	MTime    int64
	Content  string
	Target   string
}

// snapshot describes every entry below dir (dir itself excluded).
func snapshot(t testing.TB, dir string) map[string]treeEntry {
	t.Helper()
	out := make(map[string]treeEntry)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, MTime: fi.ModTime().Unix()}
		switch {
		case fi.Mode().IsRegular():
			e.Type = "file"
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.Content = string(b)
		case fi.IsDir():
			e.Type = "dir"
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Type = "symlink"
			e.MTime = 0 // not restored on symlinks
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			e.Type = "other"
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// makeTree fills dir with files, directories and links of various modes.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	big := make([]byte, 300<<10)
	rand.Read(big)
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	files := []struct {
		name    string
		mode    fs.FileMode
		content []byte
	}{
		{"a.txt", 0o640, []byte("alpha\n")},
		{"run.sh", 0o755 | fs.ModeSetuid, []byte("#!/bin/sh\n")},
		{"sub/b.bin", 0o600, big},
		{"sub/deep/c", 0o444, []byte("c")},
		{"empty.txt", 0o644, nil},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.content, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "emptydir"), 0o751); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"link": "a.txt", "sub/up": "../a.txt", "abs": "/etc/hostname"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(dir, "a.txt"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	// Times last, deepest first, so that creating entries does not touch
	// a directory's time afterwards.
	for _, p := range []string{"sub/deep/c", "sub/deep", "sub/b.bin", "sub", "a.txt", "run.sh", "empty.txt", "emptydir"} {
		if err := os.Chtimes(filepath.Join(dir, p), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
}

// readTar returns the headers and contents of a tar stream.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string]string) {
	t.Helper()
	tr := tar.NewReader(r)
	var hdrs []*tar.Header
	contents := make(map[string]string)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return hdrs, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, hdr)
		contents[hdr.Name] = string(b)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	src := filepath.Join(a.root, "src")
	makeTree(t, src)

	body, err := a.client.ReadArchive(ctx, "/src")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	_, err = io.Copy(&archive, body)
	body.Close()
	if err != nil {
		t.Fatal(err)
	}
	hdrs, contents := readTar(t, bytes.NewReader(archive.Bytes()))
	var names []string
	for _, h := range hdrs {
		names = append(names, h.Name)
	}
	wantNames := []string{"a.txt", "abs", "empty.txt", "emptydir/", "link", "run.sh", "sub/", "sub/b.bin", "sub/deep/", "sub/deep/c", "sub/up"}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Fatalf("entries (-want +got):\n%s", diff)
	}
	for _, h := range hdrs {
		switch h.Name {
		case "link":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "a.txt" {
				t.Errorf("link entry %+v", h)
			}
		case "run.sh":
			if h.Mode != 0o4755 || contents[h.Name] != "#!/bin/sh\n" {
				t.Errorf("run.sh entry mode %#o", h.Mode)
			}
		case "sub/":
			if h.Typeflag != tar.TypeDir || h.Mode != 0o700 {
				t.Errorf("sub entry %+v", h)
			}
		case "a.txt":
			if h.ModTime.Unix() != time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC).Unix() {
				t.Errorf("a.txt mtime %v", h.ModTime)
			}
			if os.Geteuid() == 0 && (h.Uid != 1234 || h.Gid != 5678) {
				t.Errorf("a.txt owner %d:%d", h.Uid, h.Gid)
			}
		}
	}

	if err := a.client.WriteArchive(ctx, "/dst/copy", bytes.NewReader(archive.Bytes())); err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, src)
	delete(want, "fifo") // not archived
	if diff := cmp.Diff(want, snapshot(t, filepath.Join(a.root, "dst", "copy"))); diff != "" {
		t.Fatalf("extracted tree (-want +got):\n%s", diff)
	}

	t.Run("gzip upload", func(t *testing.T) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(archive.Bytes())
		zw.Close()
		if err := a.client.WriteArchive(ctx, "/dst/gz", &gz); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, snapshot(t, filepath.Join(a.root, "dst", "gz"))); diff != "" {
			t.Fatalf("extracted tree (-want +got):\n%s", diff)
		}
	})
	t.Run("single file", func(t *testing.T) {
		body, err := a.client.ReadArchive(ctx, "/src/sub/deep/c")
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		hdrs, contents := readTar(t, body)
		if len(hdrs) != 1 || hdrs[0].Name != "c" || hdrs[0].Mode != 0o444 || contents["c"] != "c" {
			t.Fatalf("entries %+v", hdrs)
		}
	})
	t.Run("symlink at path is followed inside root", func(t *testing.T) {
		if err := os.Symlink("src/sub", filepath.Join(a.root, "sublink")); err != nil {
			t.Fatal(err)
		}
		body, err := a.client.ReadArchive(ctx, "/sublink")
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		hdrs, _ := readTar(t, body)
		if len(hdrs) != 4 || hdrs[0].Name != "b.bin" {
			t.Fatalf("entries %+v", hdrs)
		}
	})
}

func TestArchiveReadErrors(t *testing.T) {
	a, outside := sandboxBeside(t)
	if err := os.Symlink("../outside", filepath.Join(a.root, "esc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(a.root, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(a.root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want error
	}{
		{"/missing", errdefs.ErrNotFound},
		{"relative", errdefs.ErrInvalidArgument},
		{"/fifo", errdefs.ErrFailedPrecondition},
		{"/esc", errdefs.ErrPermissionDenied},
		{"/esc/secret", errdefs.ErrPermissionDenied},
		{"/abs", errdefs.ErrPermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			body, err := a.client.ReadArchive(t.Context(), tt.path)
			if err == nil {
				body.Close()
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("ReadArchive: %v, want %v", err, tt.want)
			}
		})
	}
	// Links below the archived directory are archived as links, never
	// followed.
	body, err := a.client.ReadArchive(t.Context(), "/")
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	_, contents := readTar(t, body)
	for name, c := range contents {
		if strings.Contains(c, "outside secret") {
			t.Fatalf("entry %s holds the secret from outside the root", name)
		}
	}
}

// tarOf builds a tar stream from entries.
func tarOf(t *testing.T, entries ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len("pwned"))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("pwned"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestArchiveUploadRefusesEscapes(t *testing.T) {
	testutil.RequiresRoot(t) // a sandbox agent runs as root; chown needs it too
	a, outside := sandboxBeside(t)
	if err := os.Symlink("../outside", filepath.Join(a.root, "escdir")); err != nil {
		t.Fatal(err)
	}
	file := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	dir := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
	symlink := func(name, target string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}
	}
	hardlink := func(name, target string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target}
	}
	tests := []struct {
		name      string
		dest      string
		entries   []*tar.Header
		want      error
		wantEntry string // named in the error
	}{
		{name: "dotdot", dest: "/up", entries: []*tar.Header{file("ok"), file("../x")}, want: errdefs.ErrInvalidArgument, wantEntry: `"../x"`},
		{name: "dotdot through directory", dest: "/up", entries: []*tar.Header{dir("d/"), file("d/../../../outside/x")}, want: errdefs.ErrInvalidArgument, wantEntry: `"d/../../../outside/x"`},
		{name: "absolute name", dest: "/up", entries: []*tar.Header{file("/x")}, want: errdefs.ErrInvalidArgument, wantEntry: `"/x"`},
		{name: "absolute outside name", dest: "/up", entries: []*tar.Header{file(filepath.Join(outside, "x"))}, want: errdefs.ErrInvalidArgument, wantEntry: "outside/x"},
		{name: "symlink then write", dest: "/up", entries: []*tar.Header{symlink("l", "../../outside"), file("l/x")}, want: errdefs.ErrInvalidArgument, wantEntry: `"l/x"`},
		{name: "absolute symlink then write", dest: "/up", entries: []*tar.Header{symlink("l", outside), file("l/x")}, want: errdefs.ErrInvalidArgument, wantEntry: `"l/x"`},
		{name: "symlink then directory", dest: "/up", entries: []*tar.Header{symlink("l", outside), dir("l/sub/")}, want: errdefs.ErrInvalidArgument, wantEntry: `"l/sub/"`},
		{name: "hard link out", dest: "/up", entries: []*tar.Header{hardlink("h", "../../outside/secret")}, want: errdefs.ErrInvalidArgument, wantEntry: `"h"`},
		{name: "absolute hard link", dest: "/up", entries: []*tar.Header{hardlink("h", filepath.Join(outside, "secret"))}, want: errdefs.ErrInvalidArgument, wantEntry: `"h"`},
		{name: "destination is a link out", dest: "/escdir", entries: []*tar.Header{file("x")}, want: errdefs.ErrPermissionDenied},
		{name: "destination below a link out", dest: "/escdir/sub", entries: []*tar.Header{file("x")}, want: errdefs.ErrPermissionDenied},
		{name: "not a tar", dest: "/up", entries: nil, want: errdefs.ErrInvalidArgument},
	}
	before := snapshot(t, outside)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(strings.Repeat("not a tar ", 100))
			if tt.entries != nil {
				body = tarOf(t, tt.entries...)
			}
			err := a.client.WriteArchive(t.Context(), tt.dest, body)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantEntry) {
				t.Fatalf("WriteArchive: %v, want %v naming %s", err, tt.want, tt.wantEntry)
			}
			if diff := cmp.Diff(before, snapshot(t, outside)); diff != "" {
				t.Fatalf("outside changed (-before +after):\n%s", diff)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(a.root), "x")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("x beside the root: %v", err)
			}
		})
	}
}

// An upload refused while its client still holds the body open (sending
// nothing more) is answered at once.
func TestArchiveUploadRefusedMidStream(t *testing.T) {
	testutil.RequiresRoot(t)
	a, outside := sandboxBeside(t)
	pr, pw := io.Pipe()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside})
		tw.WriteHeader(&tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5})
		tw.Write([]byte("pwned"))
		tw.Flush() // no end-of-archive marker: the body stays open
	}()
	defer func() {
		pw.Close()
		<-sent
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := a.client.WriteArchive(ctx, "/up", pr)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"l/x"`) {
		t.Fatalf("WriteArchive: %v, want invalid argument naming \"l/x\"", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("x outside: %v", err)
	}
}
