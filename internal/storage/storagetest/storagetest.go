// Package storagetest is the conformance suite that every storage.Backend
// runs from its own tests: templates appear only when complete and are
// read-only, roots are isolated copy-on-write views, deletes are
// idempotent, failures leave nothing behind, disk limits are either
// enforced or refused, and volumes (storage.Volumes) are kept apart from
// roots, copied, limited or refused a limit.
//
// The suite covers the contract that callers see. Leak checks (mounts,
// loop devices) need to know where a backend keeps its state, so they
// belong to the New function each backend passes in: it should
// register, with t.Cleanup, a Close of the backend followed by those
// checks. Cleanups that the suite registers (deleting roots) run before
// it.
package storagetest

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/storage"
)

// Reopen opens a second backend on b's state, as a daemon restarted after
// a crash does (b is not closed first), and arranges its Close like the
// New function of Config.
type Reopen func(t *testing.T, b storage.Backend) storage.Backend

// Config is what a backend's test tells the suite.
type Config struct {
	// New must return a fresh, empty backend for each call and arrange
	// its Close (see the package comment).
	New func(t *testing.T) storage.Backend
	// Reopen is needed by the restart cases, which are skipped with a
	// reason when it is nil.
	Reopen Reopen
	// Caps says what the backend can do beyond the contract that every
	// backend meets.
	Caps Capabilities
}

// Capabilities are the parts of the contract a backend may lack. A case
// whose capability is missing checks the refusal the contract asks for
// instead, or skips with the capability's name, so that a missing
// ability is always visible in the test output.
type Capabilities struct {
	// SealedTemplates is set when templates are read-only for every
	// process, root included (a read-only mount or subvolume), not just
	// by file mode.
	SealedTemplates bool
	// DiskLimit is set when CreateRoot enforces RootOptions.DiskBytes;
	// without it, CreateRoot must refuse a limit with
	// errdefs.ErrNotImplemented and leave nothing behind.
	DiskLimit bool
	// IDMap is set when CreateRoot shows a root through
	// RootOptions.IDMap.
	IDMap bool
	// VolumeLimit is set when CreateVolume enforces
	// VolumeOptions.SizeBytes; without it, a size must be refused with
	// errdefs.ErrNotImplemented. A backend that is no storage.Volumes
	// skips the volume cases, saying so.
	VolumeLimit bool
}

// Run runs the suite.
func Run(t *testing.T, c Config) {
	restart := func(fn func(*testing.T, storage.Backend, Reopen)) func(*testing.T, storage.Backend) {
		return func(t *testing.T, b storage.Backend) {
			if c.Reopen == nil {
				t.Skip("the backend's test gives no Reopen function")
			}
			fn(t, b, c.Reopen)
		}
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, b storage.Backend)
	}{
		{"CreateTemplate", testCreateTemplate},
		{"TemplateIsReadOnly", func(t *testing.T, b storage.Backend) { testTemplateIsReadOnly(t, b, c.Caps) }},
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
		{"UnmountAndMountRoot", func(t *testing.T, b storage.Backend) { testUnmountAndMountRoot(t, b, c.Reopen) }},
		{"ConcurrentCreateRoot", testConcurrentCreateRoot},
		{"DiskLimit", func(t *testing.T, b storage.Backend) { testDiskLimit(t, b, c.Caps) }},
		{"IDMappedRoot", func(t *testing.T, b storage.Backend) { testIDMappedRoot(t, b, c.Caps) }},
		{"VolumeLifecycle", testVolumeLifecycle},
		{"VolumeCopy", testVolumeCopy},
		{"VolumeLimit", func(t *testing.T, b storage.Backend) { testVolumeLimit(t, b, c.Caps) }},
		{"RestartKeepsVolumes", restart(testRestartKeepsVolumes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, c.New(t))
		})
	}
}

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
