package pysdk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestInstall installs the package with pip from the tree alone (no
// package index: its in-tree build backend needs nothing) into a virtual
// environment that sees Debian's packages, where pip must find the
// dependencies it declares, and imports it from there.
func TestInstall(t *testing.T) {
	requirePython(t)
	requireModule(t, "venv, ensurepip", "python3-venv")
	src, err := filepath.Abs(sdkDir)
	if err != nil {
		t.Fatal(err)
	}
	venv := filepath.Join(t.TempDir(), "venv")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = t.TempDir() // not the source tree, which would shadow the install
		cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(python, "-m", "venv", "--system-site-packages", venv)
	run(filepath.Join(venv, "bin", "pip"), "install", "--no-index", src)
	out := run(filepath.Join(venv, "bin", "python"), "-c",
		"import os, corral; print(corral.__file__); print(os.path.exists(os.path.join(os.path.dirname(corral.__file__), 'py.typed'))); corral.Client('unix:///nowhere.sock').close()")
	lines := strings.Fields(out)
	if len(lines) != 2 || !strings.HasPrefix(lines[0], venv+"/") || lines[1] != "True" {
		t.Fatalf("the installed package: %q, want a module under %s with py.typed", out, venv)
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
