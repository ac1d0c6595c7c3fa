package wire

import "time"

// Restart policies of a service: what the agent does when the start
// command ends.
const (
	RestartNever     = "never"      // leave it ended (the default)
	RestartOnFailure = "on-failure" // start it again when it exits non-zero or is killed
	RestartAlways    = "always"     // start it again whenever it ends
)

// ServiceRequest asks the agent to start and supervise a sandbox's
// service: the template's start command, run as a background process
// (tag ServiceTag) whose output is read like any other's, restarted per
// Restart, and gated by Ready.
type ServiceRequest struct {
	// Start is the start command with its environment, working directory
	// and user; Stdin, TimeoutMS and MaxOutputBytes are not used.
	Start ExecRequest `json:"start"`
	// Restart is one of the Restart constants; empty means RestartNever.
	Restart string `json:"restart,omitempty"`
	// Ready, if set, is the check that must pass before the service is
	// ready; without it the service is ready once its process started.
	Ready *ReadyCheck `json:"ready,omitempty"`
	// ReadyTimeoutMS bounds the wait for readiness; 0 means the agent's
	// default.
	ReadyTimeoutMS int64 `json:"ready_timeout_ms,omitempty"`
}

// ServiceTag is the tag of a service's process in process listings.
const ServiceTag = "service"

// ReadyCheck says when a service is ready. Exactly one of Cmd, Shell,
// Port and URL is set.
type ReadyCheck struct {
	// Cmd or Shell is a command that exits 0 once the service is ready;
	// it runs with the start command's environment, directory and user.
	Cmd   []string `json:"cmd,omitempty"`
	Shell string   `json:"shell,omitempty"`
	// Port is a TCP port on the sandbox's loopback that must accept a
	// connection.
	Port int `json:"port,omitempty"`
	// URL is an http:// URL, as seen from inside the sandbox, that must
	// answer with a status below 400.
	URL string `json:"url,omitempty"`
	// IntervalMS is the pause between two attempts; 0 means the agent's
	// default.
	IntervalMS int64 `json:"interval_ms,omitempty"`
}

// Service states, in ServiceStatus.State.
const (
	ServiceStarting = "starting" // running, the ready check has not passed yet
	ServiceReady    = "ready"    // the ready check passed (the process may have restarted since)
	ServiceExited   = "exited"   // ended and not restarted (policy never, or the agent gave up)
	ServiceFailed   = "failed"   // not ready within the timeout
)

// ServiceStatus describes a sandbox's service.
type ServiceStatus struct {
	State string `json:"state"`
	// PID is the current (or last) process of the start command.
	PID int `json:"pid,omitempty"`
	// Restarts counts the times the agent started the command again.
	Restarts int        `json:"restarts"`
	ReadyAt  *time.Time `json:"ready_at,omitempty"`
	// Exit fields of the last process that ended, if any.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// Error says why the service is exited or failed.
	Error string `json:"error,omitempty"`
	// Output is the tail of the start command's output (stdout and
	// stderr together) when the service is not ready.
	Output string `json:"output,omitempty"`
}
