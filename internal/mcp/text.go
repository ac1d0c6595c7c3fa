package mcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// Output limits of tool results, in bytes. A model pays for every byte it
// reads, so tools return the start and end of long output and say how to
// read the rest.
const (
	defaultOutput = 10_000
	maxOutput     = 200_000
)

// clipWriter keeps the first and last half of at most limit bytes written
// to it and counts the rest. Its memory is bounded by limit whatever is
// written.
type clipWriter struct {
	limit int
	head  []byte
	tail  []byte // a ring of the latest bytes once head is full
	pos   int    // next write position in tail
	total int64
}

func newClipWriter(limit int) *clipWriter {
	if limit <= 0 {
		limit = defaultOutput
	}
	return &clipWriter{limit: limit}
}

func (w *clipWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.total += int64(n)
	if room := w.limit/2 - len(w.head); room > 0 {
		k := min(room, len(p))
		w.head = append(w.head, p[:k]...)
		p = p[k:]
	}
	keep := w.limit - w.limit/2
	for len(p) > 0 && keep > 0 {
		if len(w.tail) < keep {
			k := min(keep-len(w.tail), len(p))
			w.tail = append(w.tail, p[:k]...)
			p = p[k:]
			continue
		}
		k := copy(w.tail[w.pos:], p)
		w.pos = (w.pos + k) % keep
		p = p[k:]
	}
	return n, nil
}

// omitted is how many bytes were written but not kept.
func (w *clipWriter) omitted() int64 {
	return w.total - int64(len(w.head)+len(w.tail))
}

// String is what was kept, with a marker where bytes were left out.
// Invalid UTF-8 (binary output, or a character cut at the edge) shows as
// U+FFFD.
func (w *clipWriter) String() string {
	tail := append(append([]byte(nil), w.tail[w.pos:]...), w.tail[:w.pos]...)
	if n := w.omitted(); n > 0 {
		return validText(w.head) + fmt.Sprintf("\n[... %d bytes left out ...]\n", n) + validText(tail)
	}
	return validText(append(append([]byte(nil), w.head...), tail...))
}

func validText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// outputLimit checks a tool's max_output_bytes argument.
func outputLimit(n int) (int, error) {
	switch {
	case n == 0:
		return defaultOutput, nil
	case n < 0 || n > maxOutput:
		return 0, invalid("max_output_bytes must be between 1 and %d", maxOutput)
	}
	return n, nil
}

// invalid is a tool error for bad arguments.
func invalid(format string, args ...any) error {
	return &corral.Error{Status: 400, Code: corral.CodeInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// failure is the result of a tool call that failed: isError set, the
// API's error code and message as text and as structured content.
func failure(err error) *mcp.CallToolResult {
	code, msg := corral.ErrorCode(err), err.Error()
	var e *corral.Error
	switch {
	case errors.As(err, &e):
		msg = e.Message
	case unreachable(err):
		code = corral.CodeUnavailable
		msg = "cannot reach the Corral daemon, or lost the connection to it (is `corral server` running, and CORRAL_HOST right?): " + err.Error()
	default:
		code = corral.CodeInternal
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: "error " + code + ": " + msg}},
		StructuredContent: map[string]any{"error": map[string]string{"code": code, "message": msg}},
	}
}

// unreachable reports whether err is a failure to reach the daemon, or
// the loss of the connection to it (a daemon that stopped mid-call).
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
}

// ansi matches the terminal escapes of tracebacks.
var ansi = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// plain removes terminal escapes.
func plain(s string) string { return ansi.ReplaceAllString(s, "") }

// clip cuts s to its first and last limit/2 bytes, with a note.
func clip(s string, limit int) string {
	w := newClipWriter(limit)
	w.Write([]byte(s))
	return w.String()
}

// textResult is a successful result: text for the model, and the same
// facts as structured content for programs.
func textResult(text string, structured any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: structured}
}
