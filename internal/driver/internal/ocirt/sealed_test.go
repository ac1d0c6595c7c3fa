package ocirt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// copyFile copies the file at src to dst through a temporary file and a
// rename, as a package upgrade replaces a binary.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// exitCode runs path as name (multi-call binaries look at argv[0]).
func exitCode(t *testing.T, path, name string) int {
	t.Helper()
	cmd := exec.Command(path)
	cmd.Args[0] = name
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("running %s: %v", path, err)
	return -1
}

func fdOf(t *testing.T, path string) int {
	t.Helper()
	var pid, fd int
	if _, err := fmt.Sscanf(path, "/proc/%d/fd/%d", &pid, &fd); err != nil || pid != os.Getpid() {
		t.Fatalf("path %q is not /proc/%d/fd/N", path, os.Getpid())
	}
	return fd
}

// sealedTrue returns a copy of /bin/true in a temporary directory and its
// Sealed, closed at the test's end.
func sealedTrue(t *testing.T) (string, *Sealed) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tool")
	copyFile(t, "/bin/true", bin)
	s, err := NewSealed(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return bin, s
}

func TestSealed(t *testing.T) {
	bin, s := sealedTrue(t)
	first, err := s.Path()
	if err != nil {
		t.Fatal(err)
	}
	fd := fdOf(t, first)
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals != runcSeals {
		t.Errorf("seals = %#x, %v; want %#x, which runc takes for its own safe copy", seals, err, runcSeals)
	}
	want, _ := os.ReadFile(bin)
	if got, err := os.ReadFile(first); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the copy differs from the file (%v)", err)
	}
	if _, err := unix.Pwrite(fd, []byte("x"), 0); err == nil {
		t.Error("the copy can be written")
	}
	if code := exitCode(t, first, "true"); code != 0 {
		t.Errorf("the copy of true exited %d", code)
	}
	if again, _ := s.Path(); again != first {
		t.Errorf("Path() = %s, then %s with the file unchanged", first, again)
	}

	// An upgrade replaces the file: the next Path runs the new one, and
	// the old copy stays open for commands still starting from it.
	copyFile(t, "/bin/false", bin)
	second, err := s.Path()
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatal("Path() did not make a new copy of the changed file")
	}
	if code := exitCode(t, second, "false"); code != 1 {
		t.Errorf("the copy of the new file (false) exited %d", code)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil {
		t.Errorf("the old copy was closed: %v", err)
	}

	// A change of mode alone is not a new binary.
	if err := os.Chmod(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Path(); again != second {
		t.Errorf("Path() = %s after a chmod, want the copy %s", again, second)
	}

	s.Close()
	for _, p := range []string{first, second} {
		if _, err := unix.FcntlInt(uintptr(fdOf(t, p)), unix.F_GET_SEALS, 0); err == nil {
			t.Errorf("%s is still a sealed memfd after Close", p)
		}
	}
	if p, err := s.Path(); err == nil || p != bin {
		t.Errorf("Path() after Close = %s, %v; want the file and an error", p, err)
	}
}

// TestSealedScriptUpgrade: a binary replaced by a script runs from its
// file, whose interpreter can open it, until it is a binary again.
func TestSealedScriptUpgrade(t *testing.T) {
	bin, s := sealedTrue(t)
	if err := os.WriteFile(bin+".new", []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second time from the remembered failure
		if p, err := s.Path(); err == nil || p != bin {
			t.Fatalf("Path() = %s, %v for a script; want the file and an error", p, err)
		}
	}
	if code := exitCode(t, bin, bin); code != 3 {
		t.Errorf("the script exited %d", code)
	}
	copyFile(t, "/bin/false", bin)
	p, err := s.Path()
	if err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, p, "false"); code != 1 {
		t.Errorf("the copy of the binary that replaced the script exited %d", code)
	}
}

func TestSealedRejectsScripts(t *testing.T) {
	script := filepath.Join(t.TempDir(), "runc")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec runc \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if s, err := NewSealed(script); err == nil {
		s.Close()
		t.Fatal("NewSealed accepted a script, whose interpreter could not open /proc/self/fd/N")
	}
	if _, err := NewSealed(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("NewSealed accepted a missing file")
	}
}

func TestCommandRunsSealedCopy(t *testing.T) {
	s, err := NewSealed("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := CLI{Name: "true", Path: "/bin/true", Root: t.TempDir(), Sealed: s}
	cmd := c.Command(t.Context(), "state", "x")
	if !strings.HasPrefix(cmd.Path, "/proc/") || cmd.Args[0] != "/bin/true" {
		t.Errorf("command runs %s as %q; want the sealed copy, named by the file", cmd.Path, cmd.Args[0])
	}
	if err := cmd.Run(); err != nil {
		t.Errorf("running the sealed copy: %v", err)
	}
}
