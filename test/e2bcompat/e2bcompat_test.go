package e2bcompat

import (
	"strings"
	"testing"
)

// TestSDK runs the scripts of testdata, each a use of the SDK as its
// documentation shows it, against one daemon.
func TestSDK(t *testing.T) {
	h := startHarness(t)
	for _, script := range []string{"lifecycle", "commands", "files", "pty"} {
		t.Run(script, func(t *testing.T) {
			if out := h.node(t, script+".mjs"); !strings.Contains(out, "ok "+script) {
				t.Fatalf("%s did not finish: %s", script, out)
			}
		})
	}
	t.Run("binary", func(t *testing.T) { testBinary(t, h) })
}
