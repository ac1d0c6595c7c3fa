package btrfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

// TestLayerDir: a root's layer directory lies in its subvolume, out of
// the sandbox's sight, and goes with the root; a missing root has none.
func TestLayerDir(t *testing.T) {
	b, _ := newTestBackend(t)
	ctx := t.Context()
	must(t, b.CreateTemplate(ctx, "base", writeFile("f", "1")))
	root, err := b.CreateRoot(ctx, "r1", "base", storage.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := b.LayerDir("r1")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := b.LayerDir("r1"); err != nil || again != dir {
		t.Fatalf("a second LayerDir = %q, %v; want %q", again, err, dir)
	}
	sub, _ := subvolIDAt(filepath.Join(b.rootsDir(), "r1"))
	if in, err := subvolIDAt(dir); err != nil || in != sub || sub == 0 {
		t.Fatalf("the layer directory is in subvolume %d (%v), want the root's %d", in, err, sub)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(root); err != nil || len(ents) != 1 {
		t.Fatalf("the sandbox's root shows %v (%v), want only the template's file", ents, err)
	}
	must(t, b.DeleteRoot(ctx, "r1"))
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the layer directory outlived its root: %v", err)
	}
	if _, err := b.LayerDir("r1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("LayerDir of a deleted root = %v, want not_found", err)
	}
}
