package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
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
// process and returns the binary's path. The same binary is the daemon, the
// CLI and the in-sandbox agent (`corral agent`).
func CorralBinary(t testing.TB) string {
	t.Helper()
	return StaticBinary(t, "./cmd/corral")
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
		dir, err := os.MkdirTemp("", "corral-bin-")
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

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
