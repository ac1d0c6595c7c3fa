package agentserver_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// sentinelSecret is the content of the file beside the root; no
	// answer may ever contain it.
	sentinelSecret = "SENTINEL-SECRET-6f1d"
	// sentinelName is a name that exists only beside the root.
	sentinelName = "sentinel-only-name"
	// sentinelMode is a mode no file in the root has.
	sentinelMode = 0o612
)

// FuzzFilePaths feeds arbitrary paths to every file operation of an agent
// confined to a Root, in which symbolic links point outside (relative,
// absolute, through a directory, in a loop), and checks that nothing
// beside the root was read, created, changed or removed.
func FuzzFilePaths(f *testing.F) {
	for _, seed := range [][2]string{
		{"/esc/secret", "/x"},
		{"/esc", "/esc/new"},
		{"/abs/secret", "/abs/" + sentinelName},
		{"/../sentinel/secret", "/.."},
		{"/dir/up", "/dir/up2"},
		{"/dir/../../sentinel", "/"},
		{"/loop/x", "/loop"},
		{"/dir/file", "/esc/file"},
		{"/escdir/x", "../x"},
		{"/", "/dir"},
		{"/dir", "/abs"},
		{"/new/dir", "/escdir/" + sentinelName},
		{"//esc//./secret", "/dir/./../esc/./x"},
		{"/dir\x00/file", "x\x00y"},
	} {
		f.Add(seed[0], seed[1])
	}

	base := f.TempDir()
	root := filepath.Join(base, "root")
	sentinel := filepath.Join(base, "sentinel")
	if err := os.MkdirAll(filepath.Join(sentinel, sentinelName), 0o755); err != nil {
		f.Fatal(err)
	}
	secret := filepath.Join(sentinel, "secret")
	if err := os.WriteFile(secret, []byte(sentinelSecret), 0o600); err != nil {
		f.Fatal(err)
	}
	if err := os.Chmod(secret, sentinelMode); err != nil {
		f.Fatal(err)
	}
	resetRoot(f, root, sentinel)
	before := outsideRoot(f, base)
	a := startAgentWith(f, agentserver.Options{Root: root})

	f.Fuzz(func(t *testing.T, p1, p2 string) {
		resetRoot(t, root, sentinel)
		p1, p2 = absolute(p1), absolute(p2)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		c := a.client

		// Reads: nothing from beside the root comes back.
		checkInfo := func(op string, info wire.FileInfo) {
			if info.Name == sentinelName || info.Mode == sentinelMode || info.Size == int64(len(sentinelSecret)) && info.Type == wire.FileTypeFile {
				t.Fatalf("%s(%q) described a file beside the root: %+v", op, p1, info)
			}
		}
		checkBytes := func(op string, b []byte) {
			if bytes.Contains(b, []byte(sentinelSecret)) {
				t.Fatalf("%s(%q) returned data from beside the root", op, p1)
			}
		}
		if info, err := c.Stat(ctx, p1); err == nil {
			checkInfo("Stat", info)
		}
		if infos, err := c.List(ctx, p1); err == nil {
			for _, info := range infos {
				checkInfo("List", info)
			}
		}
		if r, _, err := c.ReadFile(ctx, p1); err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			checkBytes("ReadFile", b)
		}
		if r, err := c.ReadArchive(ctx, p1); err == nil {
			// Link targets may name what is outside; names and contents
			// may not come from there.
			tr := tar.NewReader(r)
			for {
				hdr, err := tr.Next()
				if err != nil {
					break
				}
				if strings.Contains(hdr.Name, sentinelName) || hdr.Mode == sentinelMode {
					t.Fatalf("ReadArchive(%q) has entry %+v from beside the root", p1, hdr)
				}
				b, _ := io.ReadAll(tr)
				checkBytes("ReadArchive", b)
			}
			r.Close()
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Millisecond)
		_ = c.Watch(wctx, p1, true, func(ev wire.WatchEvent) error {
			if strings.Contains(ev.Path, sentinelName) {
				t.Fatalf("Watch(%q) reported %+v", p1, ev)
			}
			return nil
		})
		wcancel()

		// Writes: whatever they do, they do it inside the root.
		_, _ = c.WriteFile(ctx, p1, 0o644, strings.NewReader("fuzz"))
		_, _ = c.Mkdir(ctx, wire.MkdirRequest{Path: p2, Parents: true})
		_, _ = c.Rename(ctx, p1, p2)
		_, _ = c.Rename(ctx, "/dir", p1)
		if archive, ok := fuzzTar(strings.TrimPrefix(p2, "/")); ok {
			_ = c.WriteArchive(ctx, p1, archive)
		}
		_ = c.Remove(ctx, p2, true)
		_ = c.Remove(ctx, p1, false)

		if diff := cmp.Diff(before, outsideRoot(t, base)); diff != "" {
			t.Fatalf("paths %q, %q changed what is beside the root (-before +after):\n%s", p1, p2, diff)
		}
	})
}

// absolute makes p absolute, so that fuzzing explores more than the
// refusal of relative paths.
func absolute(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return "/" + p
}

// fuzzTar returns an archive with a file named name, and a symlink that
// points outside followed by a file through it.
func fuzzTar(name string) (*bytes.Buffer, bool) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../sentinel", Mode: 0o777},
		{Name: "l/" + sentinelName + "/x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
	} {
		if tw.WriteHeader(h) != nil {
			return nil, false
		}
		if h.Size > 0 {
			tw.Write([]byte("fuzz"))
		}
	}
	if tw.Close() != nil {
		return nil, false
	}
	return &buf, true
}

// resetRoot gives root its starting contents: a plain tree and symbolic
// links that lead beside it. The root directory itself stays, since the
// agent holds it open.
func resetRoot(t testing.TB, root, sentinel string) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "dir", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dir", "file"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"esc":    "../sentinel",
		"abs":    sentinel,
		"dir/up": "../../sentinel/secret",
		"escdir": "dir/../../sentinel/" + sentinelName,
		"loop":   "loop",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
}

// outsideRoot describes everything in base except the root's contents:
// the sentinel tree and base itself.
func outsideRoot(t testing.TB, base string) map[string]treeEntry {
	t.Helper()
	all := snapshot(t, base)
	for name := range all {
		if strings.HasPrefix(name, "root"+string(filepath.Separator)) {
			delete(all, name)
		}
	}
	delete(all, "root") // its times change with every reset
	fi, err := os.Lstat(base)
	if err != nil {
		t.Fatal(err)
	}
	all["."] = treeEntry{Type: "dir", Mode: fi.Mode()}
	return all
}
