package corral

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"
)

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// StartOptions describe a process that belongs to the sandbox rather than
// to the call that started it: it keeps running when the client goes away,
// its output is kept (the last 1 MiB) for re-attaching, and its exit status
// is kept until the process is removed. Exactly one of Cmd and Shell is set.
type StartOptions struct {
	Cmd   []string
	Shell string // run with /bin/sh -c
	Env   map[string]string
	Cwd   string
	User  string // name or uid[:gid]; default root
	// Stdin is written to the process first; unless OpenStdin is set, its
	// stdin is then closed. Nil with OpenStdin unset means /dev/null.
	Stdin []byte
	// PTY, when set, runs the process on a new terminal of this size; its
	// output then arrives as stdout only, and stdin is open.
	PTY *PTYSize
	// OpenStdin keeps stdin open for SendStdin and Attach until CloseStdin.
	OpenStdin bool
	// Tag is a free-form label shown in listings.
	Tag string
	// Timeout kills the process after this long; 0 means none.
	Timeout time.Duration
}

// Process describes a process started with StartProcess (or a running
// foreground Exec).
type Process struct {
	PID        int       `json:"pid"`
	Cmd        []string  `json:"cmd"`
	Cwd        string    `json:"cwd,omitempty"`
	User       string    `json:"user,omitempty"`
	Tag        string    `json:"tag,omitempty"`
	PTY        bool      `json:"pty"`
	Background bool      `json:"background"`
	Running    bool      `json:"running"`
	StartedAt  time.Time `json:"started_at"`
	// The exit fields are set once Running is false. ExitCode is the exit
	// status, or 128+signal number after a signal.
	ExitedAt *time.Time `json:"exited_at,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	TimedOut bool       `json:"timed_out,omitempty"`
	// OutputBytes counts all output so far; the last 1 MiB of it is kept.
	OutputBytes int64 `json:"output_bytes"`
}

type startRequest struct {
	execRequest
	PTY       *PTYSize `json:"pty,omitempty"`
	OpenStdin bool     `json:"open_stdin,omitempty"`
	Tag       string   `json:"tag,omitempty"`
}

func processesPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/processes" }

func processPath(id string, pid int, suffix string) string {
	return processesPath(id) + "/" + strconv.Itoa(pid) + suffix
}

// StartProcess starts a process and returns at once with its description.
// A process that cannot start is an error, as with Exec.
func (c *Client) StartProcess(ctx context.Context, id string, opts StartOptions) (*Process, error) {
	req := startRequest{
		execRequest: execRequest{Cmd: opts.Cmd, Shell: opts.Shell, Env: opts.Env, Cwd: opts.Cwd, User: opts.User,
			Stdin: opts.Stdin, TimeoutMS: opts.Timeout.Milliseconds()},
		PTY: opts.PTY, OpenStdin: opts.OpenStdin, Tag: opts.Tag,
	}
	var p Process
	if err := c.doJSON(ctx, "POST", processesPath(id), nil, req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Processes lists a sandbox's running processes and the exited ones it
// still keeps.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	var out []Process
	if err := c.doJSON(ctx, "GET", processesPath(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Process describes one process.
func (c *Client) Process(ctx context.Context, id string, pid int) (*Process, error) {
	var p Process
	if err := c.doJSON(ctx, "GET", processPath(id, pid, ""), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Wait blocks until the process exits (or ctx ends) and returns its final
// description.
func (c *Client) Wait(ctx context.Context, id string, pid int) (*Process, error) {
	var p Process
	if err := c.doJSON(ctx, "GET", processPath(id, pid, "/wait"), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SendStdin streams r to the process's stdin until r ends, in one request;
// r may be long-lived (a pipe). Stdin stays open afterwards.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, r io.Reader) error {
	resp, err := c.do(ctx, "POST", processPath(id, pid, "/stdin"), nil, r, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// CloseStdin closes the process's stdin, so that it reads end of file.
func (c *Client) CloseStdin(ctx context.Context, id string, pid int) error {
	return c.doJSON(ctx, "DELETE", processPath(id, pid, "/stdin"), nil, nil, nil)
}

// Signal sends a signal ("SIGTERM", "TERM" or "15") to the process's
// process group.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	return c.doJSON(ctx, "POST", processPath(id, pid, "/signal"), nil, map[string]string{"signal": signal}, nil)
}

// Kill sends SIGKILL to the process group. The process's exit status is
// kept until RemoveProcess.
func (c *Client) Kill(ctx context.Context, id string, pid int) error {
	return c.Signal(ctx, id, pid, "SIGKILL")
}

// Resize changes the terminal size of a PTY process.
func (c *Client) Resize(ctx context.Context, id string, pid int, size PTYSize) error {
	return c.doJSON(ctx, "POST", processPath(id, pid, "/resize"), nil, size, nil)
}

// RemoveProcess kills the process group if it still runs and forgets the
// process, its output and its exit status.
func (c *Client) RemoveProcess(ctx context.Context, id string, pid int) error {
	return c.doJSON(ctx, "DELETE", processPath(id, pid, ""), nil, nil, nil)
}

// OutputOptions select the part of a process's output that Output reads.
type OutputOptions struct {
	// From is a byte offset into everything the process wrote (stdout and
	// stderr together); output before it is skipped. Use the Next of an
	// earlier OutputResult to continue where it stopped.
	From int64
	// Follow keeps streaming live output until the process exits or ctx
	// ends; without it Output returns after the buffered output.
	Follow bool
	// Stdout and Stderr receive output as it arrives; nil discards it. A
	// PTY process has only stdout.
	Stdout, Stderr io.Writer
}

// OutputResult is what Output saw.
type OutputResult struct {
	// Start is the offset of the first byte Output passed on: From, or
	// the oldest byte still kept when From is older (Start-From bytes
	// are lost).
	Start int64
	// Next is the offset just past the last byte received.
	Next int64
	// Dropped counts bytes that were lost: those between From and the
	// oldest byte still buffered, and those a follower missed by falling
	// more than the buffer behind.
	Dropped int64
	// Exit is how the process ended, or nil when it still runs.
	Exit *ExecResult
}

// Output replays a process's buffered output from opts.From and, with
// Follow, streams it live until the process exits.
func (c *Client) Output(ctx context.Context, id string, pid int, opts OutputOptions) (*OutputResult, error) {
	q := url.Values{}
	if opts.From > 0 {
		q.Set("from", strconv.FormatInt(opts.From, 10))
	}
	if opts.Follow {
		q.Set("follow", "true")
	}
	resp, err := c.do(ctx, "GET", processPath(id, pid, "/output"), q, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	res := &OutputResult{Start: opts.From, Next: opts.From}
	sc := newEventScanner(resp.Body)
	for sc.Scan() {
		var ev execEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decoding output event: %w", err)
		}
		switch ev.Type {
		case "start":
			res.Dropped = ev.Dropped
			res.Start = opts.From + ev.Dropped
			if res.Next < opts.From+ev.Dropped {
				res.Next = opts.From + ev.Dropped
			}
		case "stdout", "stderr":
			data := ev.bytes()
			res.Dropped += ev.Dropped // a follower that fell too far behind
			res.Next = ev.Offset + int64(len(data))
			w := opts.Stdout
			if ev.Type == "stderr" {
				w = opts.Stderr
			}
			if w != nil {
				if _, err := w.Write(data); err != nil {
					return nil, fmt.Errorf("writing %s: %w", ev.Type, err)
				}
			}
		case "exit":
			res.Exit = ev.result(pid)
			return res, nil
		case "error":
			return nil, ev.err()
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading output stream: %w", err)
	}
	if opts.Follow {
		return nil, &Error{Code: CodeUnavailable, Message: "output stream ended before the process exited"}
	}
	return res, nil
}
