package agent

import (
	"context"
	"io"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// The methods below speak the process and tree endpoints of the agent
// protocol (see package agentd). They keep the errdefs kind of the agent's
// answer; transport failures wrap errdefs.ErrUnavailable.

var errTODO = errdefs.Errorf(errdefs.ErrNotImplemented, "not implemented yet")

// StartProcess starts a background process and returns at once.
func (c *Client) StartProcess(ctx context.Context, req wire.StartRequest) (wire.ProcessInfo, error) {
	return wire.ProcessInfo{}, errTODO
}

// Processes lists running and kept exited processes.
func (c *Client) Processes(ctx context.Context) ([]wire.ProcessInfo, error) { return nil, errTODO }

// Process describes one process.
func (c *Client) Process(ctx context.Context, pid int) (wire.ProcessInfo, error) {
	return wire.ProcessInfo{}, errTODO
}

// ProcessOutput streams a process's output from byte offset from (replaying
// what is still buffered), calling fn per event. With follow it keeps
// streaming until the process exits (the last event is exit) or ctx ends;
// without it, it returns after the buffered output (and the exit event if
// the process has ended).
func (c *Client) ProcessOutput(ctx context.Context, pid int, from int64, follow bool, fn func(wire.ExecEvent) error) error {
	return errTODO
}

// WriteStdin copies r to the process's stdin until r ends.
func (c *Client) WriteStdin(ctx context.Context, pid int, r io.Reader) error { return errTODO }

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, pid int) error { return errTODO }

// Signal sends a signal ("SIGTERM", "TERM" or "15") to the process group.
func (c *Client) Signal(ctx context.Context, pid int, signal string) error { return errTODO }

// Resize changes the size of a PTY process's terminal.
func (c *Client) Resize(ctx context.Context, pid int, size wire.PTYSize) error { return errTODO }

// Wait blocks until the process exits and returns its final description.
func (c *Client) Wait(ctx context.Context, pid int) (wire.ProcessInfo, error) {
	return wire.ProcessInfo{}, errTODO
}

// RemoveProcess kills the process group if it runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, pid int) error { return errTODO }

// ReadArchive streams a tar of path (a file, or a directory's contents).
func (c *Client) ReadArchive(ctx context.Context, path string) (io.ReadCloser, error) {
	return nil, errTODO
}

// WriteArchive extracts the tar read from r into directory path.
func (c *Client) WriteArchive(ctx context.Context, path string, r io.Reader) error { return errTODO }

// Watch streams changes under path, calling fn per event, until ctx ends
// or fn returns an error.
func (c *Client) Watch(ctx context.Context, path string, recursive bool, fn func(wire.WatchEvent) error) error {
	return errTODO
}
