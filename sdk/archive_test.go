package corral

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func makeTar(t *testing.T, entries []entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: mode, Linkname: e.link, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0)}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestWriteTarExtractTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a", "b", "f.txt"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("a/b/f.txt", filepath.Join(src, "link")))
	must(os.Mkdir(filepath.Join(src, "ro"), 0o555))

	var buf bytes.Buffer
	must(WriteTar(&buf, src))
	dst := t.TempDir()
	must(ExtractTar(&buf, dst))

	got, err := os.ReadFile(filepath.Join(dst, "a", "b", "f.txt"))
	if err != nil || string(got) != "hello" {
		t.Fatalf("f.txt = %q, %v", got, err)
	}
	for name, want := range map[string]fs.FileMode{"a/b/f.txt": 0o640, "run.sh": 0o755, "ro": 0o555 | fs.ModeDir} {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "a/b/f.txt" {
		t.Errorf("link -> %q, %v", target, err)
	}
}

// TestExtractTarRefusesEscapes feeds archives a hostile sandbox could
// send and checks that nothing lands outside the destination.
func TestExtractTarRefusesEscapes(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
	}{
		{"dot dot", []entry{{name: "../escaped", body: "x", typ: tar.TypeReg}}},
		{"nested dot dot", []entry{{name: "a/../../escaped", body: "x", typ: tar.TypeReg}}},
		{"absolute", []entry{{name: "/escaped", body: "x", typ: tar.TypeReg}}},
		{"through symlink to outside", []entry{
			{name: "l", link: "OUTSIDE", typ: tar.TypeSymlink},
			{name: "l/escaped", body: "x", typ: tar.TypeReg},
		}},
		{"through relative symlink", []entry{
			{name: "l", link: "../..", typ: tar.TypeSymlink},
			{name: "l/escaped", body: "x", typ: tar.TypeReg},
		}},
		{"directory through symlink", []entry{
			{name: "l", link: "OUTSIDE", typ: tar.TypeSymlink},
			{name: "l/sub/", typ: tar.TypeDir, mode: 0o755},
		}},
		{"hard link to outside", []entry{{name: "h", link: "../escaped", typ: tar.TypeLink}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			dst := filepath.Join(base, "dst")
			for _, d := range []string{outside, dst} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tt.entries {
				tt.entries[i].link = strings.ReplaceAll(tt.entries[i].link, "OUTSIDE", outside)
			}
			err := ExtractTar(makeTar(t, tt.entries), dst)
			if err == nil {
				t.Fatal("extraction succeeded; want an error")
			}
			for _, p := range []string{filepath.Join(base, "escaped"), filepath.Join(outside, "escaped"), filepath.Join(outside, "sub")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s was created outside the destination", p)
				}
			}
		})
	}
}

// TestExtractTarReplacesSymlink: a file entry replaces a link at its name
// instead of writing through it.
func TestExtractTarReplacesSymlink(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := makeTar(t, []entry{
		{name: "f", link: victim, typ: tar.TypeSymlink},
		{name: "f", body: "new", typ: tar.TypeReg},
	})
	if err := ExtractTar(tr, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "keep" {
		t.Fatalf("victim was overwritten: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "f")); string(got) != "new" {
		t.Fatalf("f = %q", got)
	}
}

// FuzzEntryName checks that an accepted name always stays under the
// destination.
func FuzzEntryName(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "a/../../b", "./a/", "", ".", "a//b", `\a`, "a/./..", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := entryName(name)
		if err != nil {
			return
		}
		joined := path.Join("/dst", got)
		if joined != "/dst" && !strings.HasPrefix(joined, "/dst/") {
			t.Fatalf("entryName(%q) = %q, which leaves the destination (%s)", name, got, joined)
		}
	})
}
