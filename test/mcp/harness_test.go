// Package mcp checks Corral's MCP server with the official TypeScript MCP
// client, installed from the npm registry: Node scripts written only
// against the SDK's public API drive `corral mcp` over stdio and the
// daemon's /mcp endpoint over streamable HTTP, against a live daemon with
// runc sandboxes and real storage.
package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
	corral "github.com/corralrun/corral/sdk"
)

// sdkVersion is the @modelcontextprotocol/sdk npm package the scripts are
// written and checked against.
const sdkVersion = "1.32.2"

// transports are the ways a client reaches the MCP server, as the scripts'
// MCP_TRANSPORT names them.
var transports = []string{"stdio", "http"}

// harness is a daemon serving MCP on a loopback port, and the arguments of
// `corral mcp` with the same policy.
type harness struct {
	*daemontest.Daemon
	url       string // the streamable HTTP endpoint, http://ADDR/mcp
	apiKey    string
	stdioArgs []string
}

// startHarness starts a daemon (daemontest.New) that serves the API and
// /mcp behind an API key on a loopback port. Its MCP clients, and those
// of `corral mcp` run by the scripts, get sandboxes of template on runc
// and may ask for no other runtime. The caller makes template.
func startHarness(t *testing.T, template string) *harness {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	installSDK(t)
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	addr := testutil.FreeLoopbackAddr(t)
	h := &harness{url: "http://" + addr + "/mcp", apiKey: hex.EncodeToString(key),
		stdioArgs: []string{"--template", template, "--allow-runtime", "runc", "--log-level", "info"}}
	h.Daemon = daemontest.New(t, daemontest.Options{Name: "mcp", Storage: "overlay",
		Args: []string{"--api-key", h.apiKey, "--listen", addr, "--runtime", "runc",
			"--mcp-template", template, "--mcp-allow-runtime", "runc"}})
	return h
}

// summary is what a script prints last.
type summary struct {
	// Session is the ID of the session's own sandbox, "" if the script
	// made none.
	Session string `json:"session"`
}

// run runs a script of testdata whose client reaches the daemon over
// transport: stdio through `corral mcp` on the daemon's socket, or the
// HTTP endpoint with the API key.
func (h *harness) run(t *testing.T, script, transport string) summary {
	t.Helper()
	args, err := json.Marshal(h.stdioArgs)
	if err != nil {
		t.Fatal(err)
	}
	return node(t, script, "MCP_TRANSPORT="+transport, "CORRAL_BIN="+h.Bin, "CORRAL_HOST=unix://"+h.Socket,
		"MCP_STDIO_ARGS="+string(args), "MCP_URL="+h.url, "MCP_API_KEY="+h.apiKey)
}

// checkEnded checks, after a script's session ended, that the session's
// sandbox (none when session is "") is deleted within 10 s, and that no
// other sandbox is left.
func (h *harness) checkEnded(t *testing.T, session string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); session != ""; {
		_, err := h.Client.Get(t.Context(), session)
		if corral.ErrorCode(err) == corral.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session sandbox %s is still there 10 s after the session ended (get: %v)", session, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	list, err := h.Client.List(t.Context(), corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		t.Errorf("sandbox %s (%s) is left after the session ended", sb.ID, sb.State)
	}
}

// installSDK installs the SDK once per version into a cache under the
// temporary directory and returns the directory holding node_modules.
func installSDK(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "corral-mcp-npm", "sdk-"+sdkVersion)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err == nil {
		return dir
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
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "@modelcontextprotocol/sdk@"+sdkVersion)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install @modelcontextprotocol/sdk@%s: %v\n%s", sdkVersion, err, out)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatalf("caching the SDK: %v", err)
	}
	return dir
}

// node runs a script of testdata, with client.mjs and the SDK beside it,
// for up to 2 minutes, and returns the summary it prints last. The script
// sees the test's environment without CORRAL_ and MCP_ variables, plus env.
func node(t *testing.T, script string, env ...string) summary {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{script, "client.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(installSDK(t), "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CORRAL_") && !strings.HasPrefix(kv, "MCP_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s: %s", script, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("node %s: %v\nstdout:\n%s\nstderr:\n%s", script, err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("node %s printed no summary: %v\nstdout:\n%s\nstderr:\n%s", script, err, stdout.String(), stderr.String())
	}
	return s
}
