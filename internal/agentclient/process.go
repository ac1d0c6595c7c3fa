package agentclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// The methods below speak the process and tree endpoints of the agent
// protocol (see package agentserver). They keep the errdefs kind of the agent's
// answer; transport failures wrap errdefs.ErrUnavailable, and a canceled
// ctx wraps ctx.Err().

// StartProcess starts a background process and returns at once. The
// process belongs to the sandbox, not to ctx: it keeps running after the
// call returns, until it exits or is removed.
func (c *Client) StartProcess(ctx context.Context, req wire.StartRequest) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	if err := c.call(ctx, "starting process", http.MethodPost, "/processes", nil, req, &info); err != nil {
		return wire.ProcessInfo{}, err
	}
	return info, nil
}

// Processes lists running and kept exited processes, oldest first.
func (c *Client) Processes(ctx context.Context) ([]wire.ProcessInfo, error) {
	var infos []wire.ProcessInfo
	if err := c.call(ctx, "listing processes", http.MethodGet, "/processes", nil, nil, &infos); err != nil {
		return nil, err
	}
	return infos, nil
}

// Process describes one process.
func (c *Client) Process(ctx context.Context, pid int) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	if err := c.call(ctx, "describing process "+strconv.Itoa(pid), http.MethodGet, procPath(pid, ""), nil, nil, &info); err != nil {
		return wire.ProcessInfo{}, err
	}
	return info, nil
}

// ProcessOutput streams a process's output from byte offset from (replaying
// what is still buffered), calling fn per event on the calling goroutine:
// start (with Dropped when output before from is gone), output events
// (each with its Offset), and exit once the process has ended. With follow
// it keeps streaming until the process exits (the last event is exit, and
// the call returns nil) or ctx ends; without it, it returns nil after the
// buffered output (and the exit event if the process has ended). An error
// event, an error from fn, or a stream cut short (ErrUnavailable) ends the
// call with that error. A client that re-attaches from the Offset plus
// length of the last chunk it got misses nothing and sees nothing twice.
func (c *Client) ProcessOutput(ctx context.Context, pid int, from int64, follow bool, fn func(wire.ExecEvent) error) error {
	q := url.Values{"from": {strconv.FormatInt(from, 10)}, "follow": {strconv.FormatBool(follow)}}
	action := "reading output of process " + strconv.Itoa(pid)
	return stream(ctx, c, action, procPath(pid, "/output"), q, !follow, func(ev wire.ExecEvent) (bool, error) {
		if ev.Type == wire.EventError {
			if ev.Error == nil {
				return false, errdefs.Errorf(errdefs.ErrInternal, "%s: stream failed without a reason", action)
			}
			return false, errdefs.FromCode(ev.Error.Code, ev.Error.Message)
		}
		if err := fn(ev); err != nil {
			return false, err
		}
		return ev.Type == wire.EventExit, nil
	})
}

// WriteStdin copies r to the process's stdin until r ends. The body is
// streamed as it is read (each read is sent at once, so r may be an
// interactive source that stays open for as long as the caller likes);
// nothing is buffered whole. It fails with ErrFailedPrecondition when the
// process exits or its stdin is closed first.
func (c *Client) WriteStdin(ctx context.Context, pid int, r io.Reader) error {
	if r == nil {
		r = http.NoBody
	}
	return c.call(ctx, "writing to stdin of process "+strconv.Itoa(pid), http.MethodPost, procPath(pid, "/stdin"), nil, streamBody{r}, nil)
}

// CloseStdin closes the process's stdin; on a terminal it sends the EOF
// character (^D) instead and the terminal stays open.
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.call(ctx, "closing stdin of process "+strconv.Itoa(pid), http.MethodDelete, procPath(pid, "/stdin"), nil, nil, nil)
}

// Signal sends a signal ("SIGTERM", "TERM" or "15") to the process group.
func (c *Client) Signal(ctx context.Context, pid int, signal string) error {
	return c.call(ctx, "signaling process "+strconv.Itoa(pid), http.MethodPost, procPath(pid, "/signal"), nil, wire.SignalRequest{Signal: signal}, nil)
}

// Resize changes the size of a PTY process's terminal.
func (c *Client) Resize(ctx context.Context, pid int, size wire.PTYSize) error {
	return c.call(ctx, "resizing process "+strconv.Itoa(pid), http.MethodPost, procPath(pid, "/resize"), nil, size, nil)
}

// Wait blocks until the process exits and returns its final description.
// It holds one connection for as long as it waits.
func (c *Client) Wait(ctx context.Context, pid int) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	if err := c.call(ctx, "waiting for process "+strconv.Itoa(pid), http.MethodGet, procPath(pid, "/wait"), nil, nil, &info); err != nil {
		return wire.ProcessInfo{}, err
	}
	return info, nil
}

// RemoveProcess kills the process group if it runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, pid int) error {
	return c.call(ctx, "removing process "+strconv.Itoa(pid), http.MethodDelete, procPath(pid, ""), nil, nil, nil)
}

// ReadArchive streams a tar of path (a file, or a directory's contents).
// The caller must close the reader. An archive cut short by a failure
// reads as io.ErrUnexpectedEOF, which a tar reader reports, never as a
// clean end.
func (c *Client) ReadArchive(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files/archive", url.Values{"path": {path}}, "", nil)
	if err != nil {
		return nil, fmt.Errorf("archiving %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, wire.DecodeError(resp)
	}
	return resp.Body, nil
}

// WriteArchive extracts the tar read from r (plain or gzip) into directory
// path, which is created if missing. r is streamed, not buffered. Entries
// that would land outside path fail the call with ErrInvalidArgument
// naming the entry.
func (c *Client) WriteArchive(ctx context.Context, path string, r io.Reader) error {
	if r == nil {
		r = http.NoBody
	}
	return c.call(ctx, "extracting archive into "+path, http.MethodPut, "/files/archive", url.Values{"path": {path}}, streamBody{r}, nil)
}

// Watch streams changes under path, calling fn per event on the calling
// goroutine, until ctx ends (the call returns an error wrapping ctx's),
// fn returns an error (returned as is), or the agent ends the stream
// because path itself was removed or moved (nil).
func (c *Client) Watch(ctx context.Context, path string, recursive bool, fn func(wire.WatchEvent) error) error {
	q := url.Values{"path": {path}, "recursive": {strconv.FormatBool(recursive)}}
	return stream(ctx, c, "watching "+path, "/files/watch", q, true, func(ev wire.WatchEvent) (bool, error) {
		return false, fn(ev)
	})
}

// stream does a GET whose answer is NDJSON events of type T and calls
// handle with each until it reports the last one or fails. A clean end of
// the stream is nil when cleanEnd allows it, else ErrUnavailable like a
// broken connection.
func stream[T any](ctx context.Context, c *Client, action, path string, q url.Values, cleanEnd bool, handle func(T) (last bool, err error)) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, "", nil)
	if err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return wire.DecodeError(resp)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev T
		if err := dec.Decode(&ev); err != nil {
			if err == io.EOF && cleanEnd && ctx.Err() == nil {
				return nil
			}
			return fmt.Errorf("%s: %w", action, streamError(ctx, err))
		}
		last, err := handle(ev)
		if err != nil {
			return err
		}
		if last {
			// Reading the end of the response lets the connection be
			// reused; the agent sends it right after the last event.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
			return nil
		}
	}
}

func procPath(pid int, suffix string) string {
	return "/processes/" + strconv.Itoa(pid) + suffix
}
