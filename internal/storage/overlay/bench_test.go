package overlay

import (
	"testing"

	"github.com/corralrun/corral/internal/storage/storagetest"
)

func BenchmarkCreateRootIDMap(b *testing.B) {
	be, _ := newTestBackend(b)
	storagetest.BenchCreateRootIDMap(b, be)
}
