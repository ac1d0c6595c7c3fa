package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DefaultRunRoot holds the run directories of daemons that name none: one
// per state dir (DefaultRunDir).
const DefaultRunRoot = "/run/corral"

// runDirFile, in the state dir, records the run dir the daemon last used,
// so that a daemon started with another one finds the sandboxes still
// running from the old one.
const runDirFile = "run-dir"

// DefaultRunDir is the run directory of a daemon whose state dir is
// stateDir and that names none: DefaultRunRoot/state-<hash of stateDir>,
// so that daemons with their own state dirs never share one.
func DefaultRunDir(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(DefaultRunRoot, "state-"+hex.EncodeToString(sum[:4]))
}

// runDirEntries are the directories a daemon makes in its run dir, each
// after its parent.
var runDirEntries = []string{
	"runc", "runc/state", "runc/sandboxes", "runc/userns-spares",
	"gvisor", "gvisor/state", "gvisor/sandboxes", "gvisor/ids",
	"network", "network/netns",
	"netfiles",
	"mounts",
}

// runDir is the run dir of a daemon with state dir stateDir and configured
// run dir configured: configured, unless the run dir recorded in stateDir
// is another one that still holds runtime state (hasRuntimeState); then
// the recorded one, with kept set. A state dir without a record is that of
// a Corral that kept its runtime state in the state dir itself.
func runDir(stateDir, configured string) (dir string, kept bool, err error) {
	recorded := stateDir
	switch b, err := os.ReadFile(filepath.Join(stateDir, runDirFile)); {
	case err == nil:
		recorded = strings.TrimSpace(string(b))
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("reading the recorded run dir: %w", err)
	}
	if recorded != configured && hasRuntimeState(recorded) {
		return recorded, true, nil
	}
	return configured, false, nil
}

// recordRunDir records dir as the run dir of the daemon with state dir
// stateDir.
func recordRunDir(stateDir, dir string) error {
	p := filepath.Join(stateDir, runDirFile)
	if err := os.WriteFile(p+".new", []byte(dir+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the run dir: %w", err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		return fmt.Errorf("recording the run dir: %w", err)
	}
	return nil
}

// hasRuntimeState reports whether run dir dir holds anything of sandboxes,
// running or half made, or of spares: a runc or gVisor container or
// sandbox directory, a user namespace spare, or a network namespace. A
// daemon on that run dir finds and removes what is stale; a daemon on
// another would leave all of it behind.
func hasRuntimeState(dir string) bool {
	for _, sub := range []string{"runc/state", "runc/sandboxes", "runc/userns-spares", "gvisor/state", "gvisor/sandboxes", "gvisor/ids", "network/netns", "mounts"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err == nil && len(entries) > 0 {
			return true
		}
	}
	return false
}

// removeRunDir removes the run dir dir and the directories the daemon made
// in it (runDirEntries), deepest first, as far as they are empty: anything
// else in them keeps them and their parents.
func removeRunDir(dir string) {
	for i := len(runDirEntries) - 1; i >= 0; i-- {
		_ = os.Remove(filepath.Join(dir, runDirEntries[i]))
	}
	_ = os.Remove(filepath.Join(dir, lockFile))
	_ = os.Remove(dir)
}

// maxSocketPath is the longest path of a unix socket (sun_path holds 108
// bytes with the terminating NUL).
const maxSocketPath = 107

// checkRunDir refuses a run dir too long for the agent sockets of runc
// sandboxes under it: <dir>/runc/sandboxes/<16-character ID>/agent.sock.
func checkRunDir(dir string) error {
	if n := len(filepath.Join(dir, "runc/sandboxes", strings.Repeat("x", 16), "agent.sock")); n > maxSocketPath {
		return fmt.Errorf("run dir %s is too long: sandboxes' agent socket paths in it would be %d bytes, over the %d of a unix socket", dir, n, maxSocketPath)
	}
	return nil
}

// makeRunDir creates the run dir dir, or checks the one there: a directory
// (not a symbolic link) of this user, which it makes mode 0700.
func makeRunDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating run dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checking run dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("run dir %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("run dir %s belongs to user %d, not to this daemon's %d", dir, st.Uid, os.Geteuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("making run dir private: %w", err)
	}
	return nil
}
