package runc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestInstallHolder checks the holder program: it runs and exits 0, as
// any user, and installing it again keeps a good copy and replaces a bad
// one.
func TestInstallHolder(t *testing.T) {
	if holderProgram() == nil {
		t.Skip("no holder program on this architecture: /proc/self/exe is used")
	}
	dir := t.TempDir()
	// Searchable by every user, as MountDir is (the temporary
	// directory's parent is not).
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	path, err := installHolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, holderName) {
		t.Fatalf("path %s", path)
	}
	if out, err := exec.Command(path).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("running the holder: %v, output %q", err, out)
	}
	// As the owner of a sandbox's namespace would.
	if os.Geteuid() == 0 {
		if err := asHostID(ownerID(7), func() error { return exec.Command(path).Run() }); err != nil {
			t.Fatalf("running the holder as host user %d: %v", ownerID(7), err)
		}
	}
	fi, _ := os.Stat(path)
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := installHolder(dir); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(path).Run(); err != nil {
		t.Fatalf("the replaced holder: %v", err)
	}
	again, _ := os.Stat(path)
	if _, err := installHolder(dir); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Stat(path); !os.SameFile(now, again) || again.Mode() != fi.Mode() || fi.Mode().Perm() != 0o755 {
		t.Errorf("a good holder was replaced, or the mode changed: %v %v", fi.Mode(), again.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left in the directory: %v", entries)
	}
}
