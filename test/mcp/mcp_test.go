package mcp

import (
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
)

// TestTools runs, over stdio and over streamable HTTP, the scripts of one
// session each in a sandbox of a busybox template: tools.mjs (the tool
// list, exec, files, a background process, errors and resources),
// paused.mjs (a paused session sandbox comes back as the session's) and
// arguments.mjs (arguments the schema refuses). Each session's sandbox
// must be deleted once the client ended the session. A client with a
// wrong key is refused.
func TestTools(t *testing.T) {
	h := startHarness(t, "base")
	h.BuildBusybox("base")
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			for _, script := range []string{"tools", "paused", "arguments"} {
				t.Run(script, func(t *testing.T) {
					s := h.run(t, script+".mjs", transport)
					h.checkEnded(t, s.Session)
				})
			}
		})
	}
	t.Run("wrong key", func(t *testing.T) {
		h.run(t, "wrongkey.mjs", "http")
		h.checkEnded(t, "")
	})
}

// TestRunCode runs code.mjs over stdio and over streamable HTTP, with the
// code-interpreter template as the server's default: run_code keeps
// state between calls, has separate contexts, and returns a chart as a
// PNG image.
func TestRunCode(t *testing.T) {
	h := startHarness(t, "code-interpreter")
	h.CodeInterpreterTemplate("code-interpreter")
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			s := h.run(t, "code.mjs", transport)
			h.checkEnded(t, s.Session)
		})
	}
}

// TestDaemonDown runs `corral mcp` against a socket nobody serves: a tool
// call answers at once with the tool error unavailable.
func TestDaemonDown(t *testing.T) {
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	node(t, "daemondown.mjs", "MCP_TRANSPORT=stdio", "CORRAL_BIN="+testutil.CorralBinary(t),
		"CORRAL_HOST=unix://"+filepath.Join(t.TempDir(), "no-daemon.sock"))
}
