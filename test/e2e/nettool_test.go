package e2e

import (
	"os"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
)

// nettoolPath is the sandbox path of testdata/nettool after installNettool.
const nettoolPath = "/work/nettool"

// installNettool copies testdata/nettool, built statically, into sandbox
// id at nettoolPath.
func (d *daemon) installNettool(t testing.TB, id string) {
	t.Helper()
	f, err := os.Open(testutil.StaticBinary(t, "./test/e2e/testdata/nettool"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := d.Client.WriteFile(t.Context(), id, nettoolPath, f, 0o755); err != nil {
		t.Fatalf("copying nettool into %s: %v", id, err)
	}
}
