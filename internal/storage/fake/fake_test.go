package fake

import (
	"testing"

	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/storagetest"
)

// TestConformance runs the storage suite. The fake copies trees without
// mounts, so it cannot seal templates against root or limit disk use.
func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Config{
		New: func(t *testing.T) storage.Backend { return New(t.TempDir()) },
		Reopen: func(t *testing.T, old storage.Backend) storage.Backend {
			return New(old.(*Backend).dir)
		},
		Caps: storagetest.Capabilities{},
	})
}
