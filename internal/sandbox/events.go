package sandbox

import (
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
)

// Events returns the bus on which the Manager publishes every lifecycle
// change (events.Created, Running, Paused, Resumed, Stopped, Started,
// Deleted, Error, Timeout) and every OOM kill it learns of
// (events.OOMKilled). Publishing never blocks the Manager.
func (m *Manager) Events() *events.Bus { return m.bus }

// emit publishes a lifecycle event for sb. cause, when set, is why a
// sandbox failed. Code that changes a sandbox's state (pause, resume,
// pools) calls it after the change is recorded.
func (m *Manager) emit(typ string, sb Sandbox, cause error) {
	ev := events.Event{Type: typ, SandboxID: sb.ID, State: sb.State.String(), Runtime: sb.Runtime, Template: sb.Template, Tenant: sb.Tenant}
	if cause != nil {
		ev.Error = &events.ErrorDetail{Code: errdefs.Code(cause), Message: cause.Error()}
	}
	m.bus.Publish(ev)
}
