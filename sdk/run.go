package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// RunOptions are a sandbox to create and one command to run in it (Run).
type RunOptions struct {
	Sandbox CreateOptions
	Exec    ExecOptions
	// Remove deletes the sandbox once the command has ended, also when it
	// could not start or the call was given up (docker run --rm).
	Remove bool
	// Created, when set, gets the sandbox once it exists, before any of
	// the command's output.
	Created func(*Sandbox)
}

// runRequest is the body of POST /v1/run.
type runRequest struct {
	Sandbox createRequest `json:"sandbox"`
	Exec    execRequest   `json:"exec"`
	Remove  bool          `json:"remove,omitempty"`
}

// Run creates a sandbox and runs one command in it, streaming the output
// as Exec does, in one round trip. On a cold create on runc the daemon
// hands the command to the sandbox's agent while the sandbox starts, so
// its first output comes sooner than with Create and then Exec. It returns
// the sandbox whenever one was made, also together with an error from the
// command or from deleting it. With Remove the sandbox is gone when Run
// returns, unless Run gave up first (ctx done, an output writer failed):
// the daemon then deletes it on its own.
func (c *Client) Run(ctx context.Context, opts RunOptions) (*Sandbox, *ExecResult, error) {
	b, err := json.Marshal(runRequest{Sandbox: opts.Sandbox.request(), Exec: opts.Exec.request(), Remove: opts.Remove})
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.do(ctx, "POST", "/v1/run", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	sc := newEventScanner(resp.Body)
	var first struct {
		Type    string   `json:"type"`
		Sandbox *Sandbox `json:"sandbox"`
	}
	if !sc.Scan() {
		err := sc.Err()
		if err == nil {
			err = &Error{Code: CodeUnavailable, Message: "stream ended before the sandbox event"}
		}
		return nil, nil, fmt.Errorf("reading run stream: %w", err)
	}
	if err := json.Unmarshal(sc.Bytes(), &first); err != nil || first.Type != "sandbox" || first.Sandbox == nil {
		return nil, nil, fmt.Errorf("reading run stream: the first event is not the sandbox: %.200q", sc.Bytes())
	}
	sb := first.Sandbox
	if opts.Created != nil {
		opts.Created(sb)
	}
	res, err := readExec(sc, opts.Exec)
	var fromDaemon *Error
	if !opts.Remove || (err != nil && !errors.As(err, &fromDaemon)) {
		// Returning closes the stream: the daemon kills the command and,
		// with Remove, deletes the sandbox on its own.
		return sb, res, err
	}
	// The rest of the stream, which ends once the sandbox is deleted: its
	// last event is an error when that failed.
	for sc.Scan() {
		var ev execEvent
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Type == "error" {
			err = errors.Join(err, ev.err())
		}
	}
	if serr := sc.Err(); serr != nil {
		err = errors.Join(err, fmt.Errorf("reading run stream: %w", serr))
	}
	return sb, res, err
}
