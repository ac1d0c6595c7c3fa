package storagetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/google/go-cmp/cmp"
)

func testRootHasTemplateFiles(t *testing.T, b storage.Backend) {
	// The tree's root is the sandbox's "/", which everyone must be able to
	// traverse, even when the daemon runs with a strict umask. (The suite
	// does not run in parallel, so changing the process umask is safe.)
	old := syscall.Umask(0o077)
	createTemplate(t, b, "base")
	path := createRoot(t, b, "r1", "base")
	syscall.Umask(old)
	for _, dir := range []string{b.TemplatePath("base"), path} {
		if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("mode of %s = %v (%v), want 0755", dir, st.Mode(), err)
		}
	}
	if path != b.RootPath("r1") {
		t.Errorf("CreateRoot returned %s, RootPath says %s", path, b.RootPath("r1"))
	}
	checkSample(t, path)
	// The root is writable everywhere, including in directories that came
	// from the template.
	if err := os.WriteFile(filepath.Join(path, "etc/new"), []byte("new"), 0o644); err != nil {
		t.Errorf("writing in root: %v", err)
	}
	if err := os.Mkdir(filepath.Join(path, "work"), 0o755); err != nil {
		t.Errorf("mkdir in root: %v", err)
	}
}

func testRootsAreIsolated(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	r1 := createRoot(t, b, "r1", "base")
	r2 := createRoot(t, b, "r2", "base")

	mustWrite(t, filepath.Join(r1, "etc/hostname"), "r1\n")
	mustWrite(t, filepath.Join(r1, "only-in-r1"), "x")
	appendFile(t, filepath.Join(r1, "usr/lib/data"), "more")
	if err := os.Remove(filepath.Join(r1, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(r1, "home")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(r1, "usr/bin/tool"), filepath.Join(r1, "usr/bin/tool2")); err != nil {
		t.Fatal(err)
	}

	if got := readFile(t, filepath.Join(r1, "etc/hostname")); got != "r1\n" {
		t.Errorf("r1 etc/hostname = %q after writing it", got)
	}
	for _, dir := range []string{r2, b.TemplatePath("base")} {
		checkSample(t, dir)
		if _, err := os.Lstat(filepath.Join(dir, "only-in-r1")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s sees r1's new file: %v", dir, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "usr/bin/tool2")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s sees r1's rename: %v", dir, err)
		}
	}
	// A root made after the changes starts from the template, not from r1.
	checkSample(t, createRoot(t, b, "r3", "base"))
}

// testInodesAreUnique checks that no two files in a root share a device
// and inode number, which programs take to mean "the same file" (cp
// refuses to copy, find reports a loop, tar stores a hard link). A backend
// whose layers number their inodes independently gets this wrong as soon
// as a root has more new files than its template has files.
func testInodesAreUnique(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	path := createRoot(t, b, "r1", "base")
	for i := range 40 {
		mustWrite(t, filepath.Join(path, fmt.Sprintf("file-%d", i)), "x")
		if err := os.Mkdir(filepath.Join(path, fmt.Sprintf("dir-%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(path, "etc/hostname"), "r1\n") // copied up
	appendFile(t, filepath.Join(path, "usr/lib/data"), "more")

	seen := map[[2]uint64]string{}
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		key := [2]uint64{st.Dev, st.Ino}
		if other, ok := seen[key]; ok {
			t.Errorf("%s and %s share device %d and inode %d", other, p, st.Dev, st.Ino)
		}
		seen[key] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testCreateRootFailures(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	state := stateDir(b)
	mountsBefore := testutil.Mounts(t, state)

	if _, err := b.CreateRoot(t.Context(), "r1", "missing", storage.RootOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CreateRoot from a missing template = %v, want ErrNotFound", err)
	}
	if got := roots(t, b); len(got) != 0 {
		t.Errorf("Roots after failed CreateRoot = %v, want none", got)
	}

	path := createRoot(t, b, "r1", "base")
	mustWrite(t, filepath.Join(path, "mine"), "r1")
	mountsWithR1 := testutil.Mounts(t, state)
	if _, err := b.CreateRoot(t.Context(), "r1", "base", storage.RootOptions{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second CreateRoot(r1) = %v, want ErrAlreadyExists", err)
	}
	if got := readFile(t, filepath.Join(path, "mine")); got != "r1" {
		t.Errorf("r1 lost its data after a duplicate CreateRoot: %q", got)
	}
	if diff := cmp.Diff(mountsWithR1, testutil.Mounts(t, state)); diff != "" {
		t.Errorf("mounts after duplicate CreateRoot (-before +after):\n%s", diff)
	}
	if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(mountsBefore, testutil.Mounts(t, state)); diff != "" {
		t.Errorf("mounts after DeleteRoot (-before +after):\n%s", diff)
	}
}

func testDeleteRootIdempotent(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	path := createRoot(t, b, "r1", "base")
	mustWrite(t, filepath.Join(path, "file"), "x")
	for i := range 2 {
		if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
			t.Fatalf("DeleteRoot #%d: %v", i+1, err)
		}
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("root path %s still exists: %v", path, err)
	}
	if err := b.DeleteRoot(t.Context(), "never-created"); err != nil {
		t.Errorf("DeleteRoot of an unknown root: %v", err)
	}
	// The ID can be reused and starts fresh.
	path = createRoot(t, b, "r1", "base")
	if _, err := os.Lstat(filepath.Join(path, "file")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("recreated root has the old root's file: %v", err)
	}
}

func testRootsListing(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	createRoot(t, b, "r2", "base")
	createRoot(t, b, "r1", "base")
	if diff := cmp.Diff([]string{"r1", "r2"}, roots(t, b)); diff != "" {
		t.Errorf("Roots (-want +got):\n%s", diff)
	}
	if err := b.DeleteRoot(t.Context(), "r2"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"r1"}, roots(t, b)); diff != "" {
		t.Errorf("Roots after delete (-want +got):\n%s", diff)
	}
}

func testConcurrentCreateRoot(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	const n = 10
	var wg sync.WaitGroup
	paths := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			paths[i], errs[i] = b.CreateRoot(t.Context(), fmt.Sprintf("r%02d", i), "base", storage.RootOptions{})
		})
	}
	wg.Wait()
	var want []string
	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		want = append(want, id)
		if errs[i] != nil {
			t.Errorf("CreateRoot(%s): %v", id, errs[i])
			continue
		}
		mustWrite(t, filepath.Join(paths[i], "id"), id)
	}
	if diff := cmp.Diff(want, roots(t, b)); diff != "" {
		t.Errorf("Roots (-want +got):\n%s", diff)
	}
	for i := range n {
		if errs[i] == nil {
			checkSample(t, paths[i])
			if got := readFile(t, filepath.Join(paths[i], "id")); got != want[i] {
				t.Errorf("root %s has id file %q", want[i], got)
			}
		}
	}
	for i := range n {
		wg.Go(func() { errs[i] = b.DeleteRoot(t.Context(), want[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DeleteRoot(%s): %v", want[i], err)
		}
	}
	if got := roots(t, b); len(got) != 0 {
		t.Errorf("Roots after deleting all = %v", got)
	}
}
