package pysdk

import (
	"os/exec"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
)

// TestUnit runs the unit tests: requests, stream readers, errors and tar
// safety against a fake daemon, for the blocking and the asyncio client.
func TestUnit(t *testing.T) {
	requirePython(t)
	pytest(t, nil, "tests/unit")
}

// TestTypes checks the package's type hints (it ships py.typed) with
// mypy for Python 3.9, the oldest it supports, together with
// tests/typing/usage.py, typical uses that must type-check.
func TestTypes(t *testing.T) {
	requirePython(t)
	requireModule(t, "mypy", "python3-mypy")
	cmd := exec.Command(python, "-m", "mypy", "--python-version", "3.9", "--ignore-missing-imports",
		"--cache-dir", t.TempDir(), "--no-error-summary", "corral", "tests/typing/usage.py")
	cmd.Dir = sdkDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mypy: %v\n%s", err, out)
	}
}

// TestLive runs every live test but the code interpreter's against a
// daemon on runc, then on gVisor: sandboxes, exec with streaming
// callbacks, run, background processes re-attached from a second client,
// terminals, files, lifecycle, snapshots, forks, templates, pools,
// volumes, errors and the asyncio client. The tests delete what they make;
// the daemon's cleanup checks the host for leaks.
func TestLive(t *testing.T) {
	requirePython(t)
	for _, runtime := range []string{"runc", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			_, env := startDaemon(t, runtime)
			pytest(t, env, "-m", "not code", "tests/live")
		})
	}
}

// TestCodeInterpreter runs run_code and the code contexts against
// sandboxes of the code-interpreter template on runc and on gVisor, both
// from one daemon: the template is imported once (see
// daemontest.CodeInterpreterTemplate: built once per test run, minutes).
func TestCodeInterpreter(t *testing.T) {
	requirePython(t)
	d, env := startDaemon(t, "runc")
	d.CodeInterpreterTemplate("code-interpreter")
	env = append(env, "CORRAL_TEST_CODE_TEMPLATE=code-interpreter")
	for _, runtime := range []string{"runc", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			testutil.RequiresBinary(t, runtimeBinary[runtime])
			pytest(t, append(env, "CORRAL_TEST_RUNTIME="+runtime), "-m", "code", "tests/live")
		})
	}
}
