// Package gvisortest finds what a gVisor driver left on the host, for the
// leak checks of tests that run a whole daemon (test/e2e, test/hostile).
package gvisortest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/driver/gvisor"
	"github.com/corralrun/corral/internal/mountinfo"
)

// Leftovers describes everything of a gVisor driver with Config.Root root
// (and the default MountDir) still on the host: sandboxes runsc knows,
// sandbox and gofer processes, sandbox directories, boxes (agent sockets)
// and their mounts. Empty means nothing leaked.
func Leftovers(root string) []string {
	var out []string
	state := filepath.Join(root, "state")
	if b, err := exec.Command("runsc", "--root", state, "list", "-quiet").Output(); err == nil {
		for _, id := range strings.Fields(string(b)) {
			out = append(out, "runsc sandbox "+id)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "--root="+state+"\x00") {
			out = append(out, "runsc process "+e.Name())
		}
	}
	mountDir := gvisor.MountDirFor(root)
	for _, dir := range []string{filepath.Join(root, "sandboxes"), mountDir} {
		names, _ := os.ReadDir(dir)
		for _, n := range names {
			out = append(out, filepath.Join(dir, n.Name()))
		}
	}
	mps, _ := mountinfo.Under(mountDir)
	for _, mp := range mps {
		if mp != mountDir {
			out = append(out, "mount "+mp)
		}
	}
	return out
}
