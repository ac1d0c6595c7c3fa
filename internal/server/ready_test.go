package server

import (
	"testing"

	corral "github.com/corralrun/corral/sdk"
)

// The test server's runtime saves no memory: the routes answer the
// Manager's refusals with their codes.
func TestReadySnapshotOverHTTP(t *testing.T) {
	c, _ := newTestServer(t, "")
	ctx := t.Context()
	for _, tc := range []struct {
		name, code string
		err        error
	}{
		{"capture without memory snapshots", "failed_precondition", func() error { _, err := c.CaptureReady(ctx, "bb", ""); return err }()},
		{"capture on an unknown runtime", "invalid_argument", func() error { _, err := c.CaptureReady(ctx, "bb", "nope"); return err }()},
		{"capture of an unknown template", "not_found", func() error { _, err := c.CaptureReady(ctx, "nope", ""); return err }()},
		{"drop without one", "not_found", func() error { _, err := c.DropReady(ctx, "bb", ""); return err }()},
	} {
		if got := corral.ErrorCode(tc.err); got != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.code)
		}
	}
}
