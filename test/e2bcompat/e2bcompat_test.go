package e2bcompat

import (
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corralrun/corral/internal/testutil/registrytest"
)

// TestSDK runs the scripts of testdata, each a use of the SDK as its
// documentation shows it, against a daemon whose sandboxes run on runc,
// then against one whose sandboxes run on gVisor: the E2B SDK has no say
// in the runtime, the daemon's default decides.
func TestSDK(t *testing.T) {
	for _, runtime := range []string{"runc", "gvisor"} {
		t.Run(runtime, func(t *testing.T) { testSDK(t, runtime) })
	}
}

func testSDK(t *testing.T, runtime string) {
	h := startHarness(t, runtime)
	// templates.mjs builds from an image of this registry too.
	reg := registrytest.Start(t)
	img := registrytest.Image(t, v1.Config{Env: []string{"FROM_IMAGE=yes", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/srv/app"},
		registrytest.BusyboxLayer(t))
	t.Setenv("CORRAL_TEST_IMAGE", reg.Push(t, "e2b/busybox:1", img))
	for _, script := range []string{"lifecycle", "commands", "files", "pty", "snapshots", "templates"} {
		t.Run(script, func(t *testing.T) {
			if out := h.node(t, script+".mjs"); !strings.Contains(out, "ok "+script) {
				t.Fatalf("%s did not finish: %s", script, out)
			}
		})
	}
	t.Run("binary", func(t *testing.T) { testBinary(t, h) })
	// The scripts cannot tell the runtime; the daemon's log of each create
	// can.
	created := regexp.MustCompile(`msg="sandbox created" .*runtime=(\S+)`).FindAllStringSubmatch(h.Logs(), -1)
	if len(created) == 0 {
		t.Fatal("the daemon logged no sandbox created")
	}
	for _, m := range created {
		if m[1] != runtime {
			t.Errorf("a sandbox was created on %s, want %s", m[1], runtime)
		}
	}
}

// TestCodeInterpreter runs @e2b/code-interpreter (code.mjs) against
// sandboxes of the code-interpreter template, which Sandbox.create picks
// by the SDK's default name (code-interpreter-v1), on runc and gVisor.
func TestCodeInterpreter(t *testing.T) {
	for _, runtime := range []string{"runc", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			h := startHarness(t, runtime)
			h.CodeInterpreterTemplate("code-interpreter")
			if out := h.node(t, "code.mjs"); !strings.Contains(out, "ok code") {
				t.Fatalf("code.mjs did not finish: %s", out)
			}
		})
	}
}
