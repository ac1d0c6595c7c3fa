package corral

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// AuditRecord is one entry of the daemon's audit log: a mutating API call,
// or a command started in a sandbox.
type AuditRecord struct {
	Time   time.Time `json:"time"`
	Tenant string    `json:"tenant"`
	Key    string    `json:"key"` // the name of the API key that made the call
	// Action is the call as "METHOD /path" (e.g. "POST /v1/sandboxes"),
	// or the kind of command started: "exec", "process", "pty" or "code".
	Action    string   `json:"action"`
	SandboxID string   `json:"sandbox_id"`
	Status    int      `json:"status,omitempty"` // the HTTP status of the answer
	Argv      []string `json:"argv,omitempty"`
	// CodeSHA256 is the SHA-256, in hex, of the code a "code" action ran.
	CodeSHA256 string            `json:"code_sha256,omitempty"`
	ExitCode   *int              `json:"exit_code,omitempty"`
	Signal     string            `json:"signal,omitempty"`
	DurationMS float64           `json:"duration_ms,omitempty"`
	Error      string            `json:"error,omitempty"`
	Detail     map[string]string `json:"detail,omitempty"`
}

// AuditOptions select audit records; zero fields match everything.
type AuditOptions struct {
	SandboxID string
	Key       string    // the name of an API key
	Since     time.Time // records from Since on
	// Follow keeps the call going after the records already written,
	// delivering the ones written next, until its context ends.
	Follow bool
}

// maxAuditLine bounds one record of the stream: a record holds an exec's
// argv, which may be as long as a request body (8 MiB), and longer once
// JSON escapes it.
const maxAuditLine = 64 << 20

// Audit calls fn with the records of the daemon's audit log that opts
// select, oldest first, and stops at the first error of fn, which it
// returns. Which records a key may read is the daemon's decision.
//
// It calls GET /v1/audit?sandbox=ID&key=NAME&since=RFC3339&follow=true
// (each parameter only when set), which answers application/x-ndjson: one
// AuditRecord per line. A line {"error":{"code":...,"message":...}}, the
// API's error body, ends the stream with that error, returned as an
// *Error. Without Follow the daemon ends the stream after the last
// record and Audit returns nil; with Follow, Audit returns ctx's error
// when ctx ends, and an error if the daemon ends the stream.
func (c *Client) Audit(ctx context.Context, opts AuditOptions, fn func(AuditRecord) error) error {
	q := url.Values{}
	if opts.SandboxID != "" {
		q.Set("sandbox", opts.SandboxID)
	}
	if opts.Key != "" {
		q.Set("key", opts.Key)
	}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if opts.Follow {
		q.Set("follow", "true")
	}
	resp, err := c.do(ctx, "GET", "/v1/audit", q, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxAuditLine)
	for sc.Scan() {
		var r AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			var body errorBody
			if json.Unmarshal(sc.Bytes(), &body) == nil && body.Error.Code != "" {
				return &Error{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message}
			}
			return fmt.Errorf("decoding audit record: %w", err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading audit records: %w", err)
	}
	if opts.Follow {
		return errors.New("the daemon ended the audit stream")
	}
	return nil
}
