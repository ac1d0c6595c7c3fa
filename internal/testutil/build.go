package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// builds holds the binaries built by this test process, by package.
var builds struct {
	sync.Mutex
	m map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// CorralBinary builds cmd/corral statically (CGO_ENABLED=0) once per test
// process and returns the binary's path: the daemon, the CLI and the
// in-sandbox agent (`corral agent`). The agent-only binary is built next
// to it (AgentBinary), where the daemon finds and prefers it, as in an
// installation.
func CorralBinary(t testing.TB) string {
	t.Helper()
	AgentBinary(t)
	return StaticBinary(t, "./cmd/corral")
}

// AgentBinary builds cmd/corral-agent, the agent alone, as CorralBinary
// does, and returns its path.
func AgentBinary(t testing.TB) string {
	t.Helper()
	return StaticBinary(t, "./cmd/corral-agent")
}

// StaticBinary builds the main package pkg (a path relative to the module
// root, such as "./cmd/corral") statically once per test process and
// returns the binary's path.
func StaticBinary(t testing.TB, pkg string) string {
	t.Helper()
	builds.Lock()
	if builds.m == nil {
		builds.m = map[string]*build{}
	}
	b := builds.m[pkg]
	if b == nil {
		b = &build{}
		builds.m[pkg] = b
	}
	builds.Unlock()
	b.once.Do(func() {
		dir, err := binDir()
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, b.err, b.out)
	}
	return b.path
}

// binDir returns the directory for this test process's binaries,
// corral-bin-<pid> in the temporary directory, after removing those of
// processes that are gone: a test process cannot remove its own at exit
// (tests share it; no package-wide cleanup exists), and binaries are big.
func binDir() (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), "corral-bin-*"))
	for _, d := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "corral-bin-"))
		if err != nil || pid <= 0 || unix.Kill(pid, 0) != unix.ESRCH {
			continue // not ours, or its process is alive
		}
		_ = os.RemoveAll(d)
	}
	dir := filepath.Join(os.TempDir(), "corral-bin-"+strconv.Itoa(os.Getpid()))
	return dir, os.MkdirAll(dir, 0o700)
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
