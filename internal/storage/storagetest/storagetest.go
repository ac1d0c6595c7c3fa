// Package storagetest is the conformance suite that every storage.Backend
// runs from its own tests: templates appear only when complete and are
// read-only, roots are isolated copy-on-write views, deletes are
// idempotent, failures leave nothing behind, and disk limits are either
// enforced or refused.
//
// The suite covers the contract that callers see. Leak checks (mounts,
// loop devices) need to know where a backend keeps its state, so they
// belong to the newBackend function each backend passes in: it should
// register, with t.Cleanup, a Close of the backend followed by those
// checks. Cleanups that the suite registers (deleting roots) run before
// it.
package storagetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
)

// Reopen opens a second backend on b's state, as a daemon restarted after
// a crash does (b is not closed first), and arranges its Close like the
// newBackend function given to Run.
type Reopen func(t *testing.T, b storage.Backend) storage.Backend

// Run runs the suite. newBackend must return a fresh, empty backend for
// each call and arrange its Close (see the package comment). The restart
// cases need reopen and are skipped when it is nil.
func Run(t *testing.T, newBackend func(t *testing.T) storage.Backend, reopen Reopen) {
	restart := func(fn func(*testing.T, storage.Backend, Reopen)) func(*testing.T, storage.Backend) {
		return func(t *testing.T, b storage.Backend) {
			if reopen == nil {
				t.Skip("the backend's test gives no reopen function")
			}
			fn(t, b, reopen)
		}
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, b storage.Backend)
	}{
		{"CreateTemplate", testCreateTemplate},
		{"TemplateIsReadOnly", testTemplateIsReadOnly},
		{"DuplicateTemplate", testDuplicateTemplate},
		{"FillErrorLeavesNothing", testFillErrorLeavesNothing},
		{"InvalidNames", testInvalidNames},
		{"RootHasTemplateFiles", testRootHasTemplateFiles},
		{"RootsAreIsolated", testRootsAreIsolated},
		{"InodesAreUnique", testInodesAreUnique},
		{"CreateRootFailuresLeaveNothing", testCreateRootFailures},
		{"DeleteRootIsIdempotent", testDeleteRootIdempotent},
		{"RootsListing", testRootsListing},
		{"DeleteTemplateKeepsRoots", testDeleteTemplateKeepsRoots},
		{"DeleteTemplateUnknown", testDeleteTemplateUnknown},
		{"DeletedTemplateCollected", testDeletedTemplateCollected},
		{"RestartKeepsRoots", restart(testRestartKeepsRoots)},
		{"RestartKeepsDeletedTemplate", restart(testRestartKeepsDeletedTemplate)},
		{"ConcurrentCreateRoot", testConcurrentCreateRoot},
		{"DiskLimit", testDiskLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newBackend(t))
		})
	}
}

// fillSample writes a small tree with a regular file, a subdirectory, an
// executable and a relative symlink.
func fillSample(dir string) error {
	files := map[string]string{
		"etc/hostname":   "template\n",
		"etc/passwd":     "root:x:0:0:root:/root:/bin/sh\n",
		"usr/lib/data":   strings.Repeat("x", 10000),
		"usr/bin/tool":   "#!/bin/sh\necho tool\n",
		"home/user/note": "hello\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "usr/bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil { // regardless of umask
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	return os.Symlink("../usr/bin/tool", filepath.Join(dir, "bin/tool"))
}

// checkSample fails t unless dir holds the tree fillSample writes.
func checkSample(t *testing.T, dir string) {
	t.Helper()
	if got := readFile(t, filepath.Join(dir, "etc/hostname")); got != "template\n" {
		t.Errorf("etc/hostname = %q, want %q", got, "template\n")
	}
	if got := readFile(t, filepath.Join(dir, "usr/lib/data")); len(got) != 10000 {
		t.Errorf("usr/lib/data has %d bytes, want 10000", len(got))
	}
	target, err := os.Readlink(filepath.Join(dir, "bin/tool"))
	if err != nil || target != "../usr/bin/tool" {
		t.Errorf("bin/tool links to %q (%v), want ../usr/bin/tool", target, err)
	}
	st, err := os.Stat(filepath.Join(dir, "bin/tool")) // through the link
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool -> usr/bin/tool: %v, %v; want mode 0755", st, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "home/user")); err != nil || !st.IsDir() {
		t.Errorf("home/user is not a directory: %v", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("reading %s: %v", path, err)
	}
	return string(b)
}

func createTemplate(t *testing.T, b storage.Backend, name string) {
	t.Helper()
	if err := b.CreateTemplate(t.Context(), name, fillSample); err != nil {
		t.Fatalf("CreateTemplate(%s): %v", name, err)
	}
}

// createRoot creates a root and registers its deletion.
func createRoot(t *testing.T, b storage.Backend, id, template string) string {
	t.Helper()
	path, err := b.CreateRoot(t.Context(), id, template, storage.RootOptions{})
	if err != nil {
		t.Fatalf("CreateRoot(%s, %s): %v", id, template, err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled when cleanups run.
		if err := b.DeleteRoot(context.Background(), id); err != nil {
			t.Errorf("DeleteRoot(%s): %v", id, err)
		}
	})
	return path
}

func templates(t *testing.T, b storage.Backend) []string {
	t.Helper()
	got, err := b.Templates(t.Context())
	if err != nil {
		t.Fatalf("Templates: %v", err)
	}
	return got
}

func roots(t *testing.T, b storage.Backend) []string {
	t.Helper()
	got, err := b.Roots(t.Context())
	if err != nil {
		t.Fatalf("Roots: %v", err)
	}
	return got
}

// entries lists a directory's names, hidden ones included.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("listing %s: %v", dir, err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// stateDir guesses the directory holding a backend's templates and roots
// (the deepest directory above both a template's and a root's path), for
// before/after comparisons of what is on disk and mounted.
func stateDir(b storage.Backend) string {
	dir := filepath.Dir(b.TemplatePath("x"))
	root := b.RootPath("x")
	for dir != "/" && !strings.HasPrefix(root, dir+"/") {
		dir = filepath.Dir(dir)
	}
	return dir
}

func testCreateTemplate(t *testing.T, b storage.Backend) {
	if got := templates(t, b); len(got) != 0 {
		t.Fatalf("new backend has templates %v", got)
	}
	createTemplate(t, b, "base")
	createTemplate(t, b, "alt")
	if diff := cmp.Diff([]string{"alt", "base"}, templates(t, b)); diff != "" {
		t.Errorf("Templates (-want +got):\n%s", diff)
	}
	checkSample(t, b.TemplatePath("base"))
}

func testTemplateIsReadOnly(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	dir := b.TemplatePath("base")
	err := os.WriteFile(filepath.Join(dir, "new-file"), []byte("x"), 0o644)
	if err == nil {
		t.Error("creating a file in the template succeeded")
	}
	if f, err := os.OpenFile(filepath.Join(dir, "etc/hostname"), os.O_WRONLY|os.O_TRUNC, 0); err == nil {
		f.Close()
		t.Error("opening a template file for writing succeeded")
	}
	if err := os.Remove(filepath.Join(dir, "etc/passwd")); err == nil {
		t.Error("removing a template file succeeded")
	}
	if err := os.Mkdir(filepath.Join(dir, "home/user/sub"), 0o755); err == nil {
		t.Error("creating a directory in the template succeeded")
	}
	checkSample(t, dir)
}

func testDuplicateTemplate(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	called := false
	err := b.CreateTemplate(t.Context(), "base", func(dir string) error {
		called = true
		return os.WriteFile(filepath.Join(dir, "etc"), []byte("other"), 0o644)
	})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second CreateTemplate(base) = %v, want ErrAlreadyExists", err)
	}
	if called {
		t.Log("fill ran for a duplicate name (allowed, but wasted work)")
	}
	checkSample(t, b.TemplatePath("base"))
	if diff := cmp.Diff([]string{"base"}, entries(t, filepath.Dir(b.TemplatePath("base")))); diff != "" {
		t.Errorf("templates dir after duplicate (-want +got):\n%s", diff)
	}
}

func testFillErrorLeavesNothing(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	state := stateDir(b)
	mountsBefore := testutil.Mounts(t, state)
	tmplDirBefore := entries(t, filepath.Dir(b.TemplatePath("base")))

	errFill := errors.New("fill broke")
	var filled string
	err := b.CreateTemplate(t.Context(), "broken", func(dir string) error {
		filled = dir
		if err := fillSample(dir); err != nil {
			return err
		}
		return errFill
	})
	if !errors.Is(err, errFill) {
		t.Fatalf("CreateTemplate with failing fill = %v, want it to wrap the fill error", err)
	}
	if _, err := os.Lstat(filled); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fill dir %s still exists: %v", filled, err)
	}
	if diff := cmp.Diff([]string{"base"}, templates(t, b)); diff != "" {
		t.Errorf("Templates after failed fill (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(tmplDirBefore, entries(t, filepath.Dir(b.TemplatePath("base")))); diff != "" {
		t.Errorf("templates dir after failed fill (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(mountsBefore, testutil.Mounts(t, state)); diff != "" {
		t.Errorf("mounts after failed fill (-before +after):\n%s", diff)
	}
	if _, err := os.Lstat(b.TemplatePath("broken")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("TemplatePath(broken) exists: %v", err)
	}
	// The name is free again.
	createTemplate(t, b, "broken")
}

func testInvalidNames(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	for _, name := range []string{"", ".", "..", "../x", "a/b", ".tmp-base-1234"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			if err := b.CreateTemplate(t.Context(), name, fillSample); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("CreateTemplate(%q) = %v, want ErrInvalidArgument", name, err)
			}
			if _, err := b.CreateRoot(t.Context(), name, "base", storage.RootOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("CreateRoot(%q) = %v, want ErrInvalidArgument", name, err)
			}
			if err := b.DeleteRoot(t.Context(), name); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("DeleteRoot(%q) = %v, want ErrInvalidArgument", name, err)
			}
		})
	}
	if diff := cmp.Diff([]string{"base"}, templates(t, b)); diff != "" {
		t.Errorf("Templates (-want +got):\n%s", diff)
	}
	if got := roots(t, b); len(got) != 0 {
		t.Errorf("Roots = %v, want none", got)
	}
}

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

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
}

func appendFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.WriteString(f, content); err != nil {
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

func testDeleteTemplateKeepsRoots(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	path := createRoot(t, b, "r1", "base")
	mustWrite(t, filepath.Join(path, "before"), "1")
	if err := b.DeleteTemplate(t.Context(), "base"); err != nil {
		t.Fatalf("DeleteTemplate: %v", err)
	}
	if got := templates(t, b); len(got) != 0 {
		t.Errorf("Templates after delete = %v", got)
	}
	if _, err := os.Lstat(b.TemplatePath("base")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("TemplatePath(base) still exists: %v", err)
	}
	checkSample(t, path)
	mustWrite(t, filepath.Join(path, "after"), "2")
	mustWrite(t, filepath.Join(path, "etc/passwd"), "rewritten")
	if got := readFile(t, filepath.Join(path, "before")); got != "1" {
		t.Errorf("root file written before DeleteTemplate = %q", got)
	}
	if _, err := b.CreateRoot(t.Context(), "r2", "base", storage.RootOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CreateRoot from a deleted template = %v, want ErrNotFound", err)
	}
	// The name can be reused, and the new template is not the old one.
	if err := b.CreateTemplate(t.Context(), "base", func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "v2"), []byte("2"), 0o644)
	}); err != nil {
		t.Fatalf("recreating template: %v", err)
	}
	r2 := createRoot(t, b, "r2", "base")
	if readFile(t, filepath.Join(r2, "v2")) != "2" {
		t.Error("root of the recreated template lacks its file")
	}
	checkSample(t, path)
}

func testDeleteTemplateUnknown(t *testing.T, b storage.Backend) {
	if err := b.DeleteTemplate(t.Context(), "missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteTemplate(missing) = %v, want ErrNotFound", err)
	}
	createTemplate(t, b, "base")
	if err := b.DeleteTemplate(t.Context(), "base"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteTemplate(t.Context(), "base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second DeleteTemplate(base) = %v, want ErrNotFound", err)
	}
}

// testDeletedTemplateCollected checks that a deleted template's tree,
// which a backend may keep (hidden) while roots use it, is gone once the
// last of them is.
func testDeletedTemplateCollected(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	createRoot(t, b, "r1", "base")
	r2 := createRoot(t, b, "r2", "base")
	tmplDir := filepath.Dir(b.TemplatePath("base"))
	if err := b.DeleteTemplate(t.Context(), "base"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
	checkSample(t, r2)
	if err := b.DeleteRoot(t.Context(), "r2"); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, tmplDir); len(got) != 0 {
		t.Errorf("templates dir after the last root went = %v, want empty", got)
	}
}

// testRestartKeepsRoots checks that a backend opened again after a crash
// sees the templates and roots, that a root in use keeps working through
// it, and that it can make and delete roots.
func testRestartKeepsRoots(t *testing.T, b storage.Backend, reopen Reopen) {
	createTemplate(t, b, "base")
	state := stateDir(b)
	mountsBefore := testutil.Mounts(t, state)
	path := createRoot(t, b, "r1", "base")
	mustWrite(t, filepath.Join(path, "mine"), "r1")

	b = reopen(t, b)
	if diff := cmp.Diff([]string{"base"}, templates(t, b)); diff != "" {
		t.Errorf("Templates after restart (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"r1"}, roots(t, b)); diff != "" {
		t.Errorf("Roots after restart (-want +got):\n%s", diff)
	}
	if got := readFile(t, filepath.Join(path, "mine")); got != "r1" {
		t.Errorf("root in use reads %q after restart", got)
	}
	mustWrite(t, filepath.Join(path, "after"), "2")
	checkSample(t, createRoot(t, b, "r2", "base"))
	for _, id := range []string{"r1", "r2"} {
		if err := b.DeleteRoot(t.Context(), id); err != nil {
			t.Errorf("DeleteRoot(%s) after restart: %v", id, err)
		}
	}
	if diff := cmp.Diff(mountsBefore, testutil.Mounts(t, state)); diff != "" {
		t.Errorf("mounts after deleting the roots (-before +after):\n%s", diff)
	}
}

// testRestartKeepsDeletedTemplate checks that a restart does not remove a
// deleted template's tree that a root still uses.
func testRestartKeepsDeletedTemplate(t *testing.T, b storage.Backend, reopen Reopen) {
	createTemplate(t, b, "base")
	path := createRoot(t, b, "r1", "base")
	tmplDir := filepath.Dir(b.TemplatePath("base"))
	if err := b.DeleteTemplate(t.Context(), "base"); err != nil {
		t.Fatal(err)
	}
	b = reopen(t, b)
	checkSample(t, path)
	if err := b.DeleteRoot(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, tmplDir); len(got) != 0 {
		t.Errorf("templates dir after the last root went = %v, want empty", got)
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

// testDiskLimit checks that a backend either enforces DiskBytes (writes
// past it fail with EDQUOT or ENOSPC, writes below it succeed) or refuses
// it with ErrNotImplemented and leaves nothing behind.
func testDiskLimit(t *testing.T, b storage.Backend) {
	createTemplate(t, b, "base")
	const limit = 16 << 20
	path, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: limit})
	if errors.Is(err, errdefs.ErrNotImplemented) {
		if got := roots(t, b); len(got) != 0 {
			t.Errorf("Roots after refused limit = %v, want none", got)
		}
		if _, err := os.Lstat(b.RootPath("limited")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("refused root left %s: %v", b.RootPath("limited"), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("CreateRoot with a disk limit: %v", err)
	}
	t.Cleanup(func() {
		if err := b.DeleteRoot(context.Background(), "limited"); err != nil {
			t.Errorf("DeleteRoot(limited): %v", err)
		}
	})
	// Below the limit: fine.
	mustWrite(t, filepath.Join(path, "small"), strings.Repeat("s", 1<<20))

	written, err := fillUntilError(filepath.Join(path, "big"), 4*limit)
	if err == nil {
		t.Fatalf("wrote %d bytes into a root limited to %d", written, limit)
	}
	if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past the limit failed with %v, want EDQUOT or ENOSPC", err)
	}
	if written > limit {
		t.Errorf("wrote %d bytes before the limit of %d bit", written, limit)
	}
	t.Logf("write failed after %d bytes with %v", written, err)

	// An unlimited root next to it is not limited.
	other := createRoot(t, b, "unlimited", "base")
	if n, err := fillUntilError(filepath.Join(other, "big"), 2*limit); err != nil {
		t.Errorf("unlimited root: write failed after %d bytes: %v", n, err)
	}
}

// fillUntilError writes and syncs up to max bytes to a new file at path,
// in 1 MiB chunks, and returns how much it wrote and the first error.
func fillUntilError(path string, max int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	chunk := []byte(strings.Repeat("q", 1<<20))
	var written int64
	for written < max {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			f.Close()
			return written, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return written, err
	}
	return written, f.Close()
}
