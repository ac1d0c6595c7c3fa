package testutil

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SandboxDirs makes base/root (where extraction goes) and a sentinel
// base/outside/file beside it, and returns root, outside and a snapshot of
// everything outside root to compare with afterwards.
func SandboxDirs(t testing.TB) (root, outside string, snap map[string]string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "file"), []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{filepath.Join(outside, "file"), outside, base} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside, SnapshotOutside(t, base)
}

// SnapshotOutside describes every path under base except base/root: type,
// mode, owner, mtime and contents.
func SnapshotOutside(t testing.TB, base string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == filepath.Join(base, "root") {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d mtime=%d", fi.Mode(), st.Uid, st.Gid, fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(data)
		}
		snap[strings.TrimPrefix(p, base)] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", base, err)
	}
	return snap
}
