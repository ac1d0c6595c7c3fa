package sandbox

import (
	"encoding/json"
	"fmt"

	"github.com/corralrun/corral/internal/errdefs"
)

// State is a sandbox's lifecycle state. The zero value is invalid on
// purpose, so a forgotten assignment is caught.
type State int

// The lifecycle states. Every state can move to Deleting, so a sandbox can
// always be removed, whatever went wrong.
const (
	_ State = iota
	StateCreating
	StateRunning
	StatePaused
	StateError
	StateDeleting
	// StateStopping: the sandbox's processes are being ended; a daemon
	// that dies here finishes the stop when it starts again.
	StateStopping
	// StateStopped: no process and no instance; the root's files and the
	// record stay, and Manager.StartSandbox boots it again.
	StateStopped
	// StateStarting: a stopped sandbox is being booted; a daemon that
	// dies here undoes the start, leaving it stopped.
	StateStarting
)

var stateNames = map[State]string{
	StateCreating: "creating",
	StateRunning:  "running",
	StatePaused:   "paused",
	StateError:    "error",
	StateDeleting: "deleting",
	StateStopping: "stopping",
	StateStopped:  "stopped",
	StateStarting: "starting",
}

// transitions lists the legal moves; anything else is a bug or a race the
// caller must report as a failed precondition.
var transitions = map[State][]State{
	StateCreating: {StateRunning, StateError, StateDeleting},
	StateRunning:  {StatePaused, StateStopping, StateError, StateDeleting},
	StatePaused:   {StateRunning, StateStopping, StateError, StateDeleting},
	StateError:    {StateDeleting},
	StateDeleting: {StateDeleting, StateError},
	StateStopping: {StateStopped, StateError, StateDeleting},
	StateStopped:  {StateStarting, StateError, StateDeleting},
	StateStarting: {StateRunning, StateStopped, StateError, StateDeleting},
}

// String returns the lower-case name used in the API.
func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// ParseState parses a state name as used in the API.
func ParseState(name string) (State, error) {
	for s, n := range stateNames {
		if n == name {
			return s, nil
		}
	}
	return 0, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown sandbox state %q", name)
}

// CanMove reports whether from -> to is a legal transition.
func CanMove(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// checkMove returns an error wrapping errdefs.ErrFailedPrecondition when
// from -> to is illegal.
func checkMove(id string, from, to State) error {
	if !CanMove(from, to) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s and cannot become %s", id, from, to)
	}
	return nil
}

// MarshalJSON writes the state's name.
func (s State) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON reads a state's name.
func (s *State) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err != nil {
		return err
	}
	v, err := ParseState(name)
	if err != nil {
		return err
	}
	*s = v
	return nil
}
