package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var buildOnce struct {
	sync.Once
	path string
	err  error
	out  []byte
}

// CorralBinary builds cmd/corral statically (CGO_ENABLED=0) once per test
// process and returns the binary's path. The same binary is the daemon, the
// CLI and the in-sandbox agent (`corral agent`).
func CorralBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "corral-bin-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "corral")
		cmd := exec.Command("go", "build", "-o", buildOnce.path, "./cmd/corral")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOnce.out, buildOnce.err = cmd.CombinedOutput()
	})
	if buildOnce.err != nil {
		t.Fatalf("building corral: %v\n%s", buildOnce.err, buildOnce.out)
	}
	return buildOnce.path
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
