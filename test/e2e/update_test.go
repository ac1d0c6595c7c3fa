package e2e

import (
	"fmt"
	"strings"
	"testing"

	corral "github.com/corralrun/corral/sdk"
)

// TestUpdateLimits changes CPU and memory of a running sandbox and checks
// that the sandbox's own cgroup shows the new limits.
func TestUpdateLimits(t *testing.T) {
	d := startDaemon(t, "overlay")
	sb := d.create(t, corral.CreateOptions{MemoryMB: 128, CPUs: 0.5})
	out, errOut, code := d.corral("update", sb.ID, "--memory", "256M", "--cpus", "1.5")
	if code != 0 || !strings.Contains(out, "cpus 1.5, memory 256M") {
		t.Fatalf("corral update: %d %q %q", code, out, errOut)
	}
	got, _ := d.execOut(t, sb.ID, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
	if want := fmt.Sprintf("%d\n150000\n", 256<<20); got != want {
		t.Fatalf("cgroup limits after update = %q, want %q", got, want)
	}
	if _, err := d.Client.Update(t.Context(), sb.ID, corral.UpdateOptions{MemoryMB: 1}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("memory below the minimum: %v", err)
	}
	if _, err := d.Client.Update(t.Context(), "nope", corral.UpdateOptions{CPUs: 1}); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if s, _ := d.Client.Get(t.Context(), sb.ID); s.MemoryMB != 256 || s.CPUs != 1.5 {
		t.Fatalf("recorded limits %+v", s)
	}
}
