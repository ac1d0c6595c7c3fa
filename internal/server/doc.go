// Package server is Corral's REST API under /v1: JSON requests and
// responses, newline-delimited JSON streams for exec, process output, file
// watches and builds, raw bodies for file contents and tar archives, a
// WebSocket for attaching to processes, and errors as
// {"error":{"code","message"}}. It is the only place where error kinds
// become HTTP statuses, and what a client is told of an error is decided
// here (wire.Redact): no host paths, the full error in the log. It
// translates and validates (every numeric field against its
// sandbox.Range, before converting it); every decision belongs to the
// sandbox.Manager.
package server
