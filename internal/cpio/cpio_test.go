package cpio_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/cpio"
	"github.com/corralrun/corral/internal/testutil"
)

// TestExtract checks the archive against a real reader: GNU cpio, or
// busybox's, unpacks it into the tree that was written.
func TestExtract(t *testing.T) {
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	steps := []func() error{
		func() error { return w.Dir("lib", 0o755) },
		func() error { return w.Dir("lib/modules", 0o700) },
		func() error { return w.File("lib/modules/a.ko", 0o644, []byte("module a")) },
		func() error { return w.File("init", 0o755, []byte("#!/bin/sh\n")) },
		func() error { return w.File("empty", 0o600, nil) },
		func() error { return w.Symlink("sbin", "lib") },
		w.Close,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", buf.Len())
	}
	tool := "cpio"
	args := []string{"-i", "--quiet", "--no-absolute-filenames"}
	if _, err := exec.LookPath(tool); err != nil {
		bb := testutil.RequiresBinary(t, "busybox")
		tool, args = bb, []string{"cpio", "-i"}
	}
	dir := t.TempDir()
	cmd := exec.Command(tool, args...)
	cmd.Dir = dir
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
	}
	for name, want := range map[string]string{"lib/modules/a.ko": "module a", "init": "#!/bin/sh\n", "empty": ""} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	for name, want := range map[string]os.FileMode{"lib/modules": os.ModeDir | 0o700, "init": 0o755, "empty": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("mode of %s = %v, %v; want %v", name, fi.Mode(), err, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "sbin")); err != nil || target != "lib" {
		t.Errorf("sbin -> %q, %v; want lib", target, err)
	}
}

func TestRejects(t *testing.T) {
	w := cpio.NewWriter(&bytes.Buffer{})
	if err := w.File("/abs", 0o644, nil); err == nil {
		t.Error("an absolute name was accepted")
	}
	w = cpio.NewWriter(&bytes.Buffer{})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.File("late", 0o644, nil); err == nil {
		t.Error("an entry after Close was accepted")
	}
}
