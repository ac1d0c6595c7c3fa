package e2bcompat

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestVolumes runs testdata/volumes.mjs, E2B's volume API and volumeMounts
// used as the SDK documents them, against a daemon on runc and one on
// gVisor, and checks with Corral's CLI that E2B's volumes are Corral's:
// a volume made with the CLI is the script's to write and destroy, and the
// volume the script leaves is one the CLI inspects and removes.
func TestVolumes(t *testing.T) {
	for _, runtime := range []string{"runc", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			h := startHarness(t, runtime)
			h.corral(t, "volume", "create", "corral-made")
			if out := h.node(t, "volumes.mjs"); !strings.Contains(out, "ok volumes") {
				t.Fatalf("volumes did not finish: %s", out)
			}
			ls := h.corral(t, "volume", "ls")
			for _, gone := range []string{"corral-made", "e2b-made"} {
				if strings.Contains(ls, gone) {
					t.Errorf("volume %s, destroyed through E2B, is still listed by Corral:\n%s", gone, ls)
				}
			}
			if out := h.corral(t, "volume", "inspect", "e2b-kept"); !strings.Contains(out, "e2b-kept") {
				t.Errorf("corral volume inspect e2b-kept: %s", out)
			}
			h.corral(t, "volume", "rm", "e2b-kept")
		})
	}
}

// corral runs the CLI against the harness's daemon and returns its
// output, failing t when it fails.
func (h *harness) corral(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Bin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_HOST=unix://"+h.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
