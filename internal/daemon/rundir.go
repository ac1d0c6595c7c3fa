package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRunRoot holds the run directories of daemons that name none: one
// per state dir (DefaultRunDir).
const DefaultRunRoot = "/run/corral"

// DefaultRunDir is the run directory of a daemon whose state dir is
// stateDir and that names none: DefaultRunRoot/<hash of stateDir>, so that
// daemons with their own state dirs never share one.
func DefaultRunDir(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(DefaultRunRoot, "state-"+hex.EncodeToString(sum[:4]))
}

// runDir is the run dir of a daemon with state dir stateDir and
// configured run dir configured: configured, unless stateDir still holds
// runtime state of running sandboxes (legacyRuntimeState), which makes it
// stateDir itself, with legacy set.
func runDir(stateDir, configured string) (dir string, legacy bool) {
	if configured != stateDir && legacyRuntimeState(stateDir) {
		return stateDir, true
	}
	return configured, false
}

// legacyRuntimeState reports whether stateDir holds the runtime state of
// sandboxes that a daemon of an older layout, which kept it there, left
// running: a runc or gVisor container, or a network namespace other than
// a spare. Those sandboxes stay reachable only through their old paths.
func legacyRuntimeState(stateDir string) bool {
	for _, dir := range []string{"runc/state", "gvisor/state", "network/netns"} {
		entries, err := os.ReadDir(filepath.Join(stateDir, dir))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".spare-") {
				return true
			}
		}
	}
	return false
}

// removeEmptyDirs removes dir and the directories under it, deepest
// first, as long as they hold nothing else: a file, a socket or a mount
// point keeps it and its parents.
func removeEmptyDirs(dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i]) // fails while it holds something
	}
}
