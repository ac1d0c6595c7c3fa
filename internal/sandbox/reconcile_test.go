package sandbox

import (
	"testing"

	"github.com/corralrun/corral/internal/driver"
)

// TestRecoverAction checks reconcile's decision for every recorded state
// against every driver status.
func TestRecoverAction(t *testing.T) {
	tests := []struct {
		rec     State
		st      driver.Status
		want    recovery
		wantSet State
	}{
		{StateCreating, "", recoverRelease, StateCreating},
		{StateDeleting, "", recoverRelease, StateDeleting},
		{StateRunning, driver.StatusRunning, recoverKeep, StateRunning},
		{StateRunning, driver.StatusPaused, recoverThaw, StateRunning},
		{StateRunning, driver.StatusStopped, recoverRelease, StateRunning},
		{StateRunning, driver.StatusUnknown, recoverRelease, StateRunning},
		{StatePaused, driver.StatusRunning, recoverKeep, StateRunning},
		{StatePaused, driver.StatusPaused, recoverKeep, StatePaused},
		{StatePaused, driver.StatusStopped, recoverRelease, StatePaused},
		{StatePaused, driver.StatusUnknown, recoverRelease, StatePaused},
		{StateError, driver.StatusRunning, recoverKeep, StateRunning},
		{StateError, driver.StatusPaused, recoverKeep, StatePaused},
		{StateError, driver.StatusStopped, recoverKeep, StateError},
		{StateError, driver.StatusUnknown, recoverKeep, StateError},
		{StateStopping, "", recoverStop, StateStopped},
		{StateStopped, "", recoverStop, StateStopped},
		{StateStarting, "", recoverStop, StateStopped},
	}
	for _, tt := range tests {
		t.Run(tt.rec.String()+"/"+string(tt.st), func(t *testing.T) {
			if !asksDriver(tt.rec) && tt.st != "" {
				t.Fatalf("test case gives a status to a state reconcile does not ask about")
			}
			got, set := recoverAction(tt.rec, tt.st)
			if got != tt.want || set != tt.wantSet {
				t.Errorf("recoverAction(%s, %q) = %d, %s; want %d, %s", tt.rec, tt.st, got, set, tt.want, tt.wantSet)
			}
		})
	}
}
