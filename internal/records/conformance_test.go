package records

import (
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/records/recordstest"
)

func TestConformance(t *testing.T) {
	paths := map[recordstest.Store]string{} // the suite runs its cases one at a time
	open := func(t *testing.T, path string) recordstest.Store {
		s, err := Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		paths[s] = path
		return s
	}
	recordstest.Run(t, recordstest.Config{
		New: func(t *testing.T) recordstest.Store {
			return open(t, filepath.Join(t.TempDir(), "corral.db"))
		},
		Reopen: func(t *testing.T, old recordstest.Store) recordstest.Store {
			return open(t, paths[old])
		},
	})
}
