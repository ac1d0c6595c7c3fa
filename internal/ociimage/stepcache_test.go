package ociimage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestCopyTreeKeepsMetadataAndNeverFollowsLinks(t *testing.T) {
	parent, src := sandboxDirs(t)
	out := filepath.Join(parent, "outside")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "d/sub"), 0o750))
	must(os.WriteFile(filepath.Join(src, "d/sub/f"), []byte("data"), 0o644))
	must(os.Link(filepath.Join(src, "d/sub/f"), filepath.Join(src, "hard")))
	must(os.WriteFile(filepath.Join(src, "suid"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(src, "suid"), 0o755|os.ModeSetuid))
	must(os.Symlink(out, filepath.Join(src, "abs")))
	must(os.Symlink("../outside/sentinel", filepath.Join(src, "rel")))
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(filepath.Join(src, "d/sub/f"), old, old))
	must(os.Chtimes(filepath.Join(src, "d"), old, old))
	if os.Geteuid() == 0 {
		must(os.Lchown(filepath.Join(src, "d/sub/f"), 123, 456))
		must(os.Lchown(filepath.Join(src, "abs"), 7, 8))
	}

	dst := filepath.Join(t.TempDir(), "copy")
	must(os.Mkdir(dst, 0o700))
	must(copyTree(t.Context(), src, dst))

	if diff := cmp.Diff(tree(t, src), tree(t, dst)); diff != "" {
		t.Errorf("copy differs (-src +dst):\n%s", diff)
	}
	a, _ := os.Stat(filepath.Join(dst, "d/sub/f"))
	b, _ := os.Stat(filepath.Join(dst, "hard"))
	if !os.SameFile(a, b) {
		t.Errorf("hard link became two files")
	}
	if !a.ModTime().Equal(old) {
		t.Errorf("file mtime %v, want %v", a.ModTime(), old)
	}
	if d, _ := os.Stat(filepath.Join(dst, "d")); !d.ModTime().Equal(old) || d.Mode().Perm() != 0o750 {
		t.Errorf("directory mode %v mtime %v, want 0750 and %v", d.Mode(), d.ModTime(), old)
	}
	if s, _ := os.Stat(filepath.Join(dst, "suid")); s.Mode()&os.ModeSetuid == 0 {
		t.Errorf("setuid bit lost: %v", s.Mode())
	}
	if r, _ := os.Stat(src); r != nil {
		if c, _ := os.Stat(dst); c.Mode().Perm() != r.Mode().Perm() {
			t.Errorf("top directory mode %v, want %v", c.Mode(), r.Mode())
		}
	}
	if os.Geteuid() == 0 {
		if got := statOwner(t, filepath.Join(dst, "d/sub/f")); got != [2]int{123, 456} {
			t.Errorf("file owner %v", got)
		}
		if got := statOwner(t, filepath.Join(dst, "abs")); got != [2]int{7, 8} {
			t.Errorf("symlink owner %v", got)
		}
	}
	checkOutside(t, parent)
}

func TestDirSnapshots(t *testing.T) {
	s, err := OpenDirStepCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	dir, err := s.Prepare(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("1"), 0o644)
	if err := s.Commit(ctx, dir, "aa"); err != nil {
		t.Fatal(err)
	}
	child, err := s.Prepare(ctx, "aa")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(child, "a"), []byte("changed"), 0o644)
	if err := s.Commit(ctx, child, "bb"); err != nil {
		t.Fatal(err)
	}
	// The parent is unchanged by what its child did.
	exp := t.TempDir()
	if err := s.Export(ctx, "aa", exp); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, exp); got["a"] != "file:1" {
		t.Errorf("parent snapshot after the child changed: %v", got)
	}
	// A second commit of the same key keeps the first.
	dup, _ := s.Prepare(ctx, "")
	if err := s.Commit(ctx, dup, "aa"); err != nil {
		t.Errorf("second commit of a key: %v", err)
	}
	if _, err := os.Stat(dup); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("discarded tree still exists")
	}
	if _, err := s.Prepare(ctx, "cc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Prepare of a missing parent: %v, want ErrNotFound", err)
	}
	if _, err := s.Prepare(ctx, "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Prepare of a bad key: %v, want ErrInvalidArgument", err)
	}
	if err := s.Commit(ctx, t.TempDir(), "dd"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Commit of a foreign directory: %v, want ErrInvalidArgument", err)
	}
	left, _ := s.Prepare(ctx, "")
	n, err := s.GC(ctx, map[string]bool{"bb": true})
	if err != nil || n != 1 {
		t.Errorf("GC = %d, %v; want 1 removed", n, err)
	}
	keys, _ := s.Keys(ctx)
	if diff := cmp.Diff([]string{"bb"}, keys); diff != "" {
		t.Errorf("keys after GC (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("GC left a prepared tree")
	}
}
