package testutil

import (
	"errors"
	"github.com/corralrun/corral/internal/mountinfo"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Mounts returns the mount points at or under dir (package mountinfo).
func Mounts(t testing.TB, dir string) []string {
	t.Helper()
	out, err := mountinfo.Under(dir)
	if err != nil {
		t.Fatalf("reading mountinfo: %v", err)
	}
	return out
}

// CgroupDirs returns the cgroup directories named name below parent in every
// mounted cgroup hierarchy (v1 controllers and the v2 unified tree), e.g.
// CgroupDirs(t, "corral-test-x", "") lists leftovers of a cgroup parent.
func CgroupDirs(t testing.TB, parent string) []string {
	t.Helper()
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		p := filepath.Join(r, parent)
		entries, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, filepath.Join(p, e.Name()))
			}
		}
	}
	return out
}

// LoopDevicesBackedBy returns the loop devices whose backing file is under dir.
func LoopDevicesBackedBy(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, d := range devs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		bf := strings.TrimSpace(string(b))
		if bf == dir || strings.HasPrefix(bf, dir+"/") {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(d))))
		}
	}
	return out
}

// ProcessesWithRoot returns the PIDs of processes whose root directory or
// executable lies under dir: processes of sandboxes rooted there.
func ProcessesWithRoot(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		root, err := os.Readlink(filepath.Join("/proc", e.Name(), "root"))
		if err != nil {
			continue
		}
		if root == dir || strings.HasPrefix(root, dir+"/") {
			out = append(out, e.Name())
		}
	}
	return out
}

// Files lists what is under dir, dir included, or nothing when dir does
// not exist.
func Files(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return fs.SkipAll
		}
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Errorf("listing %s: %v", dir, err)
	}
	return out
}
