package e2e

import (
	"testing"

	corral "github.com/corralrun/corral/sdk"
)

// TestIDRangeSurvivesRestart: a sandbox keeps its host ID range across a
// daemon restart, and a sandbox created after the restart gets another.
func TestIDRangeSurvivesRestart(t *testing.T) {
	d := startDaemon(t, "btrfs")
	sb := d.create(t, corral.CreateOptions{})
	before, _ := d.execOut(t, sb.ID, "cat /proc/self/uid_map")
	d.Stop()
	d.Start()
	after, _ := d.execOut(t, sb.ID, "cat /proc/self/uid_map")
	if after != before {
		t.Errorf("uid_map after restart %q, before %q", after, before)
	}
	other := d.create(t, corral.CreateOptions{})
	if m, _ := d.execOut(t, other.ID, "cat /proc/self/uid_map"); m == before {
		t.Errorf("a sandbox created after the restart shares the range %q", m)
	}
}
