// Package wire holds the JSON shapes that cross Corral's process boundaries:
// between the daemon and the in-sandbox agent, and between the daemon and its
// API clients. The agent protocol and the public /v1 exec and file API use the
// same shapes, so the daemon can pass most of them through unchanged. What an
// API client may be told of an error is decided by Redact.
//
// The public Go SDK (sdk/) declares its own copies of these shapes because it
// must not import internal packages; a test keeps the two in step.
package wire

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/corralrun/corral/internal/errdefs"
)

// ErrorBody is the body of every error response:
// {"error":{"code":"not_found","message":"sandbox abc not found"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the code (one of the errdefs codes) and a human message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ExecRequest starts a process. Exactly one of Cmd (argv) and Shell (a
// string run with /bin/sh -c) must be set.
type ExecRequest struct {
	Cmd   []string          `json:"cmd,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	// User is a user name or a numeric uid[:gid], resolved with the
	// sandbox's own /etc/passwd and /etc/group. Empty means root.
	User string `json:"user,omitempty"`
	// Stdin is written to the process and then its stdin is closed. Nil
	// means stdin is /dev/null.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutMS kills the process group after this many milliseconds; 0
	// means no per-exec timeout (the sandbox deadline still applies).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes caps the output streamed for this exec (stdout and
	// stderr together). Past it, one marker line is sent on stderr and the
	// rest is read and discarded, so the process never blocks on a full
	// pipe. 0 means the daemon's default.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// Event types of an exec stream, in the order they can occur: one start,
// any number of stdout/stderr, then exactly one exit or error.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// ExecEvent is one line of an exec stream (newline-delimited JSON).
//
// Output chunks carry Text when the chunk is valid UTF-8 and Data (base64 in
// JSON) otherwise, so that curl shows readable output and binary output
// survives.
type ExecEvent struct {
	Type string `json:"type"`
	PID  int    `json:"pid,omitempty"`
	Text string `json:"text,omitempty"`
	Data []byte `json:"data,omitempty"`
	// Exit fields. ExitCode is the process's exit status, or 128+signal when
	// a signal ended it (as a shell reports it).
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	// OutputTruncated and OutputDiscarded are set on the exit event of an
	// exec whose output passed its MaxOutputBytes: how many bytes were
	// read from the process and not sent.
	OutputTruncated bool  `json:"output_truncated,omitempty"`
	OutputDiscarded int64 `json:"output_discarded,omitempty"`
	// Error is set on EventError: the stream failed and no exit status is
	// known.
	Error *ErrorDetail `json:"error,omitempty"`
	// Offset is, on output events of a process stream, the position of
	// this chunk's first byte in everything the process wrote (stdout and
	// stderr together); a client that re-attaches with from=Offset+len
	// misses nothing and sees nothing twice.
	Offset int64 `json:"offset,omitempty"`
	// Dropped is, on the start event of a re-attach, how many bytes before
	// the requested position were no longer buffered. On an output event
	// it is how many bytes a follower that fell more than the buffer
	// behind missed just before this chunk (Offset jumps by as much).
	Dropped int64 `json:"dropped,omitempty"`
}

// OutputEvent returns a stdout or stderr event for chunk, choosing Text or
// Data as documented on ExecEvent. The chunk is copied.
func OutputEvent(typ string, chunk []byte) ExecEvent {
	if utf8.Valid(chunk) {
		return ExecEvent{Type: typ, Text: string(chunk)}
	}
	return ExecEvent{Type: typ, Data: append([]byte(nil), chunk...)}
}

// Bytes returns the output carried by an output event.
func (e ExecEvent) Bytes() []byte {
	if e.Text != "" {
		return []byte(e.Text)
	}
	return e.Data
}

// FileInfo describes one file in the sandbox. Path is absolute inside the
// sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // "file", "dir", "symlink" or "other"
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits, e.g. 0644
	ModTime time.Time `json:"mod_time"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	// Target is the link target of a symlink.
	Target string `json:"target,omitempty"`
}

// File types used in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// MkdirRequest creates a directory.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
}

// RenameRequest moves From to To inside the sandbox.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Health is the agent's answer to GET /health.
type Health struct {
	OK      bool   `json:"ok"`
	Version string `json:"version"`
	PID     int    `json:"pid"`
}

// WriteError writes err as an ErrorBody with the HTTP status that matches
// its kind.
func WriteError(w http.ResponseWriter, err error) {
	code := errdefs.Code(err)
	w.Header().Set("Content-Type", "application/json")
	SetRetryAfter(w, err)
	w.WriteHeader(HTTPStatus(code))
	_ = json.NewEncoder(w).Encode(ErrorBody{Error: ErrorDetail{Code: code, Message: err.Error()}})
}

// SetRetryAfter sets the Retry-After header from err's retry hint
// (errdefs.WithRetryAfter), if it has one; call it before WriteHeader.
func SetRetryAfter(w http.ResponseWriter, err error) {
	if d := errdefs.RetryAfter(err); d > 0 {
		// "Retry-After: delay-seconds", a non-negative decimal integer
		// (RFC 9110, 10.2.3): round up, so a client never retries early.
		w.Header().Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	}
}

// HTTPStatus maps an error code to its HTTP status.
func HTTPStatus(code string) int {
	switch code {
	case errdefs.CodeInvalidArgument:
		return http.StatusBadRequest
	case errdefs.CodeNotFound:
		return http.StatusNotFound
	case errdefs.CodeAlreadyExists:
		return http.StatusConflict
	case errdefs.CodeFailedPrecondition:
		return http.StatusConflict
	case errdefs.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case errdefs.CodeBusy:
		return http.StatusServiceUnavailable
	case errdefs.CodeUnavailable:
		return http.StatusServiceUnavailable
	case errdefs.CodeUnauthenticated:
		return http.StatusUnauthorized
	case errdefs.CodePermissionDenied:
		return http.StatusForbidden
	case errdefs.CodeNotImplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// DecodeError reads an ErrorBody from an HTTP response and returns it as an
// errdefs error of the same kind. A body that is not an ErrorBody becomes an
// error of the kind that matches the status.
func DecodeError(resp *http.Response) error {
	var body ErrorBody
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<16)).Decode(&body); err != nil || body.Error.Code == "" {
		return errdefs.FromCode(codeForStatus(resp.StatusCode), "unexpected HTTP status "+resp.Status)
	}
	return errdefs.FromCode(body.Error.Code, body.Error.Message)
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return errdefs.CodeInvalidArgument
	case http.StatusNotFound:
		return errdefs.CodeNotFound
	case http.StatusConflict:
		return errdefs.CodeFailedPrecondition
	case http.StatusTooManyRequests:
		return errdefs.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		return errdefs.CodeUnavailable
	case http.StatusUnauthorized:
		return errdefs.CodeUnauthenticated
	case http.StatusForbidden:
		return errdefs.CodePermissionDenied
	case http.StatusNotImplemented:
		return errdefs.CodeNotImplemented
	default:
		return errdefs.CodeInternal
	}
}

// StartRequest starts a process that belongs to the sandbox rather than to
// the request: it keeps running when the client goes away, its output is
// kept in a bounded buffer for re-attaching, and its exit status is kept
// after it ends until the process is removed.
type StartRequest struct {
	ExecRequest
	// PTY, when set, runs the process on a new pseudo-terminal of this
	// size; its output then arrives as stdout only, and stdin is open.
	PTY *PTYSize `json:"pty,omitempty"`
	// OpenStdin keeps the process's stdin open for later writes (after
	// ExecRequest.Stdin, if any) until it is closed explicitly.
	OpenStdin bool `json:"open_stdin,omitempty"`
	// Tag is a free-form label shown in listings.
	Tag string `json:"tag,omitempty"`
}

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ProcessInfo describes a process started with StartRequest (or a running
// foreground exec).
type ProcessInfo struct {
	PID        int       `json:"pid"`
	Cmd        []string  `json:"cmd"`
	Cwd        string    `json:"cwd,omitempty"`
	User       string    `json:"user,omitempty"`
	Tag        string    `json:"tag,omitempty"`
	PTY        bool      `json:"pty"`
	Background bool      `json:"background"`
	Running    bool      `json:"running"`
	StartedAt  time.Time `json:"started_at"`
	// Exit fields are set once the process ended (Running false).
	ExitedAt *time.Time `json:"exited_at,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	TimedOut bool       `json:"timed_out,omitempty"`
	// OutputBytes counts all output the process produced so far; the
	// buffer keeps the last OutputBufferBytes of it.
	OutputBytes int64 `json:"output_bytes"`
}

// SignalRequest names a signal: "SIGTERM", "TERM" or a number like "15".
type SignalRequest struct {
	Signal string `json:"signal"`
}

// WatchEvent is one change under a watched directory.
type WatchEvent struct {
	// Type is "create", "write", "remove", "rename" or "chmod"; "overflow"
	// means events were lost and the client should rescan.
	Type string `json:"type"`
	// Path is absolute inside the sandbox.
	Path string `json:"path"`
	// OldPath is, on a rename within the watched tree, where the entry
	// was before (Path is where it is now). A rename event without it
	// means the entry at Path moved out of the watched tree.
	OldPath string    `json:"old_path,omitempty"`
	Time    time.Time `json:"time"`
	// IsDir is true when the changed entry is a directory.
	IsDir bool `json:"is_dir,omitempty"`
}

// Watch event types.
const (
	WatchCreate   = "create"
	WatchWrite    = "write"
	WatchRemove   = "remove"
	WatchRename   = "rename"
	WatchChmod    = "chmod"
	WatchOverflow = "overflow"
)
