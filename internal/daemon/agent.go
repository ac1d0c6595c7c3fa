package daemon

import (
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
)

// AgentBinary is the file name of the agent-only binary (cmd/corral-agent).
const AgentBinary = "corral-agent"

// DefaultAgent returns the agent binary the daemon runs when its
// configuration names none: corral-agent next to this executable when it
// is there and usable (usableAgent), because it starts sooner than the
// full binary, which initializes every package of the daemon first; and
// this executable itself (`corral agent`) otherwise. A corral-agent passed
// over is logged.
func DefaultAgent(log *slog.Logger) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding own executable for the agent: %w", err)
	}
	lean := filepath.Join(filepath.Dir(exe), AgentBinary)
	if _, err := os.Stat(lean); err != nil {
		return exe, nil
	}
	if err := usableAgent(lean); err != nil {
		log.Warn("not using "+AgentBinary+": running this executable as the agent instead", "path", lean, "reason", err)
		return exe, nil
	}
	return lean, nil
}

// usableAgent says why the agent-only binary at path cannot stand in for
// this executable's `corral agent`, nil when it can. It must be the
// corral-agent command, a static executable (it runs in sandbox roots that
// may have no dynamic loader) and, when both binaries record the commit
// they were built from, built from the same one: an agent left over from
// an older installation would speak an older protocol.
func usableAgent(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("it is linked dynamically (build it with CGO_ENABLED=0)")
		}
	}
	theirs, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading its build information: %w", err)
	}
	if theirs.Path != agentPackage {
		return fmt.Errorf("it is %s, not %s", theirs.Path, agentPackage)
	}
	ours, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	if a, b := commitOf(ours), commitOf(theirs); a != "" && b != "" && a != b {
		return fmt.Errorf("it was built from commit %s, this executable from %s", b, a)
	}
	return nil
}

// agentPackage is the main package of the agent-only binary.
const agentPackage = "github.com/corralrun/corral/cmd/corral-agent"

// commitOf returns the commit bi was built from, with "+modified" for a
// tree with uncommitted changes, or "" when the build did not record it
// (-buildvcs=false, or built outside a checkout).
func commitOf(bi *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev + modified
}
