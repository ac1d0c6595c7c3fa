package sandbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestZeroStateInvalid(t *testing.T) {
	var s State
	if _, ok := stateNames[s]; ok {
		t.Fatal("zero State must not be a named state")
	}
	if err := json.Unmarshal([]byte(`"bogus"`), &s); err == nil {
		t.Fatal("unknown state name parsed")
	}
}

func TestEveryStateCanBeDeleted(t *testing.T) {
	for s := range stateNames {
		if !CanMove(s, StateDeleting) {
			t.Errorf("%s cannot move to deleting: a sandbox could get stuck", s)
		}
	}
}

func TestTransitions(t *testing.T) {
	tests := []struct {
		name     string
		from, to State
		ok       bool
	}{
		{"create succeeds", StateCreating, StateRunning, true},
		{"create fails", StateCreating, StateError, true},
		{"pause", StateRunning, StatePaused, true},
		{"resume", StatePaused, StateRunning, true},
		{"error cannot run", StateError, StateRunning, false},
		{"deleting cannot run", StateDeleting, StateRunning, false},
		{"running cannot be created", StateRunning, StateCreating, false},
		{"stop a running sandbox", StateRunning, StateStopping, true},
		{"stop a paused sandbox", StatePaused, StateStopping, true},
		{"stop ends stopped", StateStopping, StateStopped, true},
		{"start a stopped sandbox", StateStopped, StateStarting, true},
		{"start ends running", StateStarting, StateRunning, true},
		{"a failed start ends stopped", StateStarting, StateStopped, true},
		{"stopped cannot run without a start", StateStopped, StateRunning, false},
		{"stopped cannot pause", StateStopped, StatePaused, false},
		{"stopped can fail", StateStopped, StateError, true},
		{"error cannot be started", StateError, StateStarting, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkMove("x", tt.from, tt.to)
			if tt.ok != (err == nil) {
				t.Fatalf("checkMove(%s, %s) = %v, want ok=%v", tt.from, tt.to, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("error %v is not a failed precondition", err)
			}
		})
	}
}

func TestStateJSONRoundTrip(t *testing.T) {
	for s := range stateNames {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var got State
		if err := json.Unmarshal(b, &got); err != nil || got != s {
			t.Fatalf("round trip of %s: got %s, %v", s, got, err)
		}
	}
}

func TestValidateTemplateName(t *testing.T) {
	for _, name := range []string{"default", "bb", "python-3.12", "a_b", "0", strings.Repeat("x", 63)} {
		if err := ValidateTemplateName(name); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
	for _, name := range []string{"", "-x", ".hidden", "Upper", "a/b", "a b", "python:3", strings.Repeat("x", 64), "ü"} {
		if err := ValidateTemplateName(name); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q accepted", name)
		}
	}
}
