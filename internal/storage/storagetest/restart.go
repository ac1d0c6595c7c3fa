package storagetest

import (
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/google/go-cmp/cmp"
)

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
