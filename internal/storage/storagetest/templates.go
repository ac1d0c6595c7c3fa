package storagetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/google/go-cmp/cmp"
)

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

// testTemplateIsReadOnly checks that nobody, root included, can change a
// sealed template; a backend without SealedTemplates relies on file modes,
// which root bypasses, so the case cannot check it.
func testTemplateIsReadOnly(t *testing.T, b storage.Backend, caps Capabilities) {
	if !caps.SealedTemplates {
		t.Skip("the backend does not declare Capabilities.SealedTemplates")
	}
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
