package daemon

import (
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// A storage backend that fails to open fails Start with its own error,
// and the shutdown that follows does not trip over a backend that was
// never opened.
func TestStartWithStorageThatFailsToOpen(t *testing.T) {
	testutil.RequiresRoot(t)
	state := t.TempDir()
	_, err := Start(t.Context(), Config{StateDir: state, RunDir: filepath.Join(state, "run"),
		Socket: filepath.Join(state, "corral.sock"), Storage: "btrfs", BtrfsQuotaMode: "exact",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Start with an unknown quota mode: %v, want ErrInvalidArgument", err)
	}
}
