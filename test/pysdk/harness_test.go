// Package pysdk runs the Python SDK's tests (sdk/python/tests) with
// Debian's python3 and pytest: the unit tests, which need no daemon, and
// the live tests against a real daemon whose sandboxes run on runc, then
// on gVisor. It also measures the Python SDK's exec round trip against
// the Go SDK's on the same sandbox (BenchmarkExecRoundTrip).
package pysdk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
)

// python is Debian's interpreter: the one that sees the python3-*
// packages scripts/deps.sh installs (another python3 may come first on
// the PATH).
const python = "/usr/bin/python3"

// sdkDir is the Python package's directory, from this package's.
var sdkDir = filepath.Join("..", "..", "sdk", "python")

// runtimeBinary is the program each runtime needs on the PATH.
var runtimeBinary = map[string]string{"runc": "runc", "gvisor": "runsc"}

// requirePython skips (or, under CORRAL_TEST_REQUIRE=1, fails) unless
// Debian's python3 can import the SDK's dependencies and pytest.
func requirePython(t testing.TB) {
	t.Helper()
	testutil.RequiresBinary(t, python)
	requireModule(t, "httpx, websockets, pytest, pytest_asyncio",
		"python3-httpx, python3-websockets, python3-pytest, python3-pytest-asyncio")
}

// requireModule skips (or, under CORRAL_TEST_REQUIRE=1, fails) unless
// Debian's python3 can import module, which the Debian package pkg
// provides (pkg may name several).
func requireModule(t testing.TB, module, pkg string) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import "+module).CombinedOutput(); err != nil {
		msg := "python3 cannot import " + module + " (Debian package " + pkg + "; scripts/deps.sh installs it): " + strings.TrimSpace(string(out))
		if testutil.Required() {
			t.Fatalf("requirement missing (CORRAL_TEST_REQUIRE=1): %s", msg)
		}
		t.Skip(msg)
	}
}

// summary is pytest's last line, such as "== 26 passed in 8.86s ==".
var summary = regexp.MustCompile(`(?m)^=+ (.*) in [0-9.]+s.* =+$`)

// pytest runs pytest on args in the SDK's directory with env added, and
// fails t unless every selected test passed: under CORRAL_TEST_REQUIRE=1 a
// skipped test fails too.
func pytest(t *testing.T, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	argv := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-rs", "-v", "--color=no"}, args...)
	cmd := exec.CommandContext(ctx, python, argv...)
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	m := summary.FindStringSubmatch(out.String())
	if err != nil || m == nil {
		t.Fatalf("pytest %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	t.Logf("pytest %s: %s (%s)", strings.Join(args, " "), m[1], time.Since(start).Round(time.Millisecond))
	if strings.Contains(m[1], "skipped") && testutil.Required() {
		t.Fatalf("pytest skipped tests under CORRAL_TEST_REQUIRE=1:\n%s", out.String())
	}
	if !strings.Contains(m[1], "passed") {
		t.Fatalf("pytest ran no test:\n%s", out.String())
	}
}

// startDaemon starts a daemon whose sandboxes run on runtime, serving the
// API on its unix socket and on a loopback TCP address with an API key,
// and builds the busybox template "busybox". It returns the environment
// that points the live tests at it and tells them the daemon is theirs
// alone, so that at the end no sandbox at all may be left. The daemon refuses creates once
// sandboxes' memory limits add up to the host's memory, so that a test
// can reach a Busy answer without hundreds of sandboxes.
func startDaemon(t testing.TB, runtime string) (*daemontest.Daemon, []string) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, runtimeBinary[runtime])
	testutil.RequiresBinary(t, "busybox")
	addr := testutil.FreeLoopbackAddr(t)
	key := "pysdk-test-key"
	d := daemontest.New(t, daemontest.Options{Name: "pysdk", Storage: "overlay",
		Args: []string{"--runtime", runtime, "--listen", addr, "--api-key", key, "--memory-commit-ratio", "1"}})
	d.BuildBusybox("busybox")
	return d, []string{
		"CORRAL_HOST=unix://" + d.Socket,
		"CORRAL_TEST_TEMPLATE=busybox",
		"CORRAL_TEST_RUNTIME=" + runtime,
		"CORRAL_TEST_TCP_HOST=http://" + addr,
		"CORRAL_TEST_TCP_KEY=" + key,
		"CORRAL_TEST_MEMORY_COMMIT_RATIO=1",
		"CORRAL_TEST_DEDICATED=1",
	}
}
