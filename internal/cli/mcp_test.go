package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corralrun/corral/internal/testutil"
)

// TestMCPOverStdio runs `corral mcp` on pipes, as an agent does, with no
// daemon behind it: the protocol works, each tool call says the daemon
// is unreachable, and the end of stdin ends the command.
func TestMCPOverStdio(t *testing.T) {
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	var errOut testutil.SyncBuffer
	env := Env{Stdin: stdinR, Stdout: stdoutW, Stderr: &errOut, Getenv: func(k string) string {
		if k == "CORRAL_HOST" {
			return "unix:///nonexistent/corral.sock"
		}
		return ""
	}}
	code := make(chan int, 1)
	go func() {
		code <- Main([]string{"mcp", "--allow-runtime", "runc,gvisor"}, env, nil, nil)
		stdoutW.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(),
		&mcp.IOTransport{Reader: stdoutR, Writer: stdinW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools: %v %v", tools, err)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	if tc, _ := res.Content[0].(*mcp.TextContent); !res.IsError || tc == nil || !strings.HasPrefix(tc.Text, "error unavailable: cannot reach the Corral daemon") {
		t.Fatalf("exec without a daemon: %+v", res.Content)
	}
	cs.Close()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d: %s", c, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("corral mcp did not end with its stdin")
	}
	if !strings.Contains(errOut.String(), "the Corral daemon does not answer") {
		t.Fatalf("stderr %q", errOut.String())
	}
}

func TestMCPUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"bad network", []string{"mcp", "--network", "wide"}, `network mode "wide"`},
		{"rules without allowlist", []string{"mcp", "--allow-domain", "a.test"}, "need network mode allowlist"},
		{"allowlist without rules", []string{"mcp", "--network", "allowlist"}, "needs a domain or address rule"},
		{"bad cidr", []string{"mcp", "--network", "allowlist", "--allow-cidr", "ten"}, `address rule "ten"`},
		{"arguments", []string{"mcp", "extra"}, "unexpected arguments"},
		{"bad log level", []string{"mcp", "--log-level", "loud"}, "invalid --log-level"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
			if code := Main(tt.args, env, nil, nil); code != exitUsage {
				t.Fatalf("exit %d, want %d", code, exitUsage)
			}
			if !strings.Contains(errOut.String(), tt.want) || out.Len() != 0 {
				t.Fatalf("stderr %q, stdout %q; want %q on stderr", errOut.String(), out.String(), tt.want)
			}
		})
	}
}
