package daemon

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
)

// TestUsableAgent: the daemon takes only a static corral-agent from the
// same commit in place of `corral agent`.
func TestUsableAgent(t *testing.T) {
	if err := usableAgent(testutil.AgentBinary(t)); err != nil {
		t.Errorf("corral-agent of this tree: %v", err)
	}
	script := filepath.Join(t.TempDir(), "corral-agent")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec corral agent \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path, want string }{
		{"the full binary", testutil.CorralBinary(t), "cmd/corral, not"},
		{"a dynamic executable", testutil.RequiresBinary(t, "true"), "linked dynamically"},
		{"a script", script, "bad magic"},
	} {
		if err := usableAgent(tt.path); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s (%s): %v, want an error with %q", tt.name, tt.path, err, tt.want)
		}
	}
}

func TestCommitOf(t *testing.T) {
	bi := func(kv ...string) *debug.BuildInfo {
		var b debug.BuildInfo
		for i := 0; i+1 < len(kv); i += 2 {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return &b
	}
	for _, tt := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{bi(), ""},
		{bi("vcs.modified", "true"), ""},
		{bi("vcs.revision", "abc", "vcs.modified", "false"), "abc"},
		{bi("vcs.revision", "abc", "vcs.modified", "true"), "abc+modified"},
	} {
		if got := commitOf(tt.bi); got != tt.want {
			t.Errorf("commitOf(%v) = %q, want %q", tt.bi.Settings, got, tt.want)
		}
	}
}
