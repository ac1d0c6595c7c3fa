package btrfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestScratchDir(t *testing.T) {
	b, _ := newTestBackend(t)
	dir, err := b.ScratchDir("build")
	if err != nil {
		t.Fatal(err)
	}
	if on, err := isBtrfs(dir); err != nil || !on {
		t.Fatalf("scratch dir %s on btrfs: %v, %v", dir, on, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := b.ScratchDir("build")
	if err != nil || again != dir {
		t.Fatalf("second ScratchDir = %q, %v; want %q", again, err, dir)
	}
	if names, err := b.Templates(t.Context()); err != nil || len(names) != 0 {
		t.Fatalf("templates after ScratchDir: %v, %v", names, err)
	}
	for _, name := range []string{"", "templates", "roots", "seed", "spares", "..", "a/b"} {
		if _, err := b.ScratchDir(name); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ScratchDir(%q) = %v, want invalid argument", name, err)
		}
	}
}
