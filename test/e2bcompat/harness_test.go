// Package e2bcompat checks that the official e2b SDK, installed from the
// npm registry, runs against Corral's E2B facade: Node scripts written
// only against the SDK's public API run against a live daemon (runc or
// gVisor, and real storage) with nothing set but E2B_API_URL, E2B_SANDBOX_URL,
// E2B_VOLUME_API_URL and E2B_API_KEY. A Go test speaks the binary protobuf encoding with the
// message descriptors shipped inside the same SDK package.
package e2bcompat

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
)

// sdkVersion is the e2b npm package the suite is written and checked
// against; CORRAL_E2B_SDK_VERSION overrides it (e.g. "latest").
const sdkVersion = "2.51.0"

// codeInterpreterVersion is the @e2b/code-interpreter npm package
// installed beside it.
const codeInterpreterVersion = "2.8.0"

// harness is a daemon with the E2B facade, and the e2b SDK installed.
type harness struct {
	*daemontest.Daemon
	url    string // E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL
	apiKey string
	sdkDir string // holds node_modules/e2b
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startHarness installs the SDK, starts the daemon (daemontest.New) with
// the facade and sandboxes on runtime, and builds the busybox template
// "base" (E2B's default template name). At the end of t every sandbox is
// deleted, the daemon stopped, and the host checked for leaks.
func startHarness(t *testing.T, runtime string) *harness {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, runtimeBinary[runtime])
	testutil.RequiresBinary(t, "busybox")
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	h := &harness{apiKey: randHex(16), sdkDir: installSDK(t)}
	// The real daemon serves the facade with --e2b-listen.
	addr := testutil.FreeLoopbackAddr(t)
	h.url = "http://" + addr
	h.Daemon = daemontest.New(t, daemontest.Options{Name: "e2bcompat", Storage: "overlay",
		Args: []string{"--api-key", h.apiKey, "--e2b-listen", addr, "--runtime", runtime}})
	h.BuildBusybox("base")
	return h
}

// runtimeBinary is the program each runtime needs on the PATH.
var runtimeBinary = map[string]string{"runc": "runc", "gvisor": "runsc"}

// installSDK installs the e2b package once per version into a cache under
// the temporary directory and returns the directory holding node_modules.
func installSDK(t *testing.T) string {
	t.Helper()
	version := sdkVersion
	if v := os.Getenv("CORRAL_E2B_SDK_VERSION"); v != "" {
		version = v
	}
	dir := filepath.Join(os.TempDir(), "corral-e2bcompat-npm", "e2b-"+version+"-ci-"+codeInterpreterVersion)
	if version != "latest" {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter", "package.json")); err == nil {
			return dir
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(`{"private":true,"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "e2b@"+version,
		"@e2b/code-interpreter@"+codeInterpreterVersion)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install e2b@%s @e2b/code-interpreter@%s: %v\n%s", version, codeInterpreterVersion, err, out)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatalf("caching the SDK: %v", err)
	}
	return dir
}

// node runs a script of testdata with the SDK, pointed at the daemon.
func (h *harness) node(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{script, "check.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(h.sdkDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	// Only the variables of the docs point the SDK at Corral; no
	// E2B_DEBUG, E2B_DOMAIN or other setting of the caller leaks in.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "E2B_API_URL="+h.url, "E2B_SANDBOX_URL="+h.url, "E2B_VOLUME_API_URL="+h.url, "E2B_API_KEY="+h.apiKey)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s: %s", script, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("node %s: %v\nstdout:\n%s\nstderr:\n%s\ndaemon logs (tail):\n%s", script, err, stdout.String(), stderr.String(), tail(h.Logs(), 60))
	}
	return stdout.String()
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
