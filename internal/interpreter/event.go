package interpreter

import (
	"encoding/json"
	"strings"
	"time"
)

// Event types of an execution stream, as @e2b/code-interpreter reads
// them. Every stream ends with exactly one EventEnd.
const (
	EventStdout     = "stdout"
	EventStderr     = "stderr"
	EventResult     = "result"
	EventError      = "error"
	EventCount      = "number_of_executions"
	EventKeepalive  = "keepalive"
	EventEnd        = "end_of_execution"
	EventUnexpected = "unexpected_end_of_execution"
)

// Event is one line of an execution stream.
type Event struct {
	Type string
	// Text is the output of a stdout or stderr event.
	Text string
	// Result is a result's fields (text, html, png, data, chart, ...,
	// extra), built by resultFields; Main says whether it is the value of
	// the last expression (an execute_result) rather than a display.
	Result map[string]any
	Main   bool
	// Name, Value and Traceback describe an error.
	Name, Value, Traceback string
	// Count is the execution count of a number_of_executions event.
	Count int
	// TimedOut and Truncated, on the end event, say that the execution
	// was interrupted at its deadline and that output was dropped past the
	// limit. They are Corral's; the E2B SDK ignores them.
	TimedOut  bool
	Truncated int64
}

// MarshalJSON writes the event as a line of E2B's stream: a result's
// fields beside "type" and "is_main_result", and no field whose value is
// empty.
func (e Event) MarshalJSON() ([]byte, error) {
	m := map[string]any{"type": e.Type}
	switch e.Type {
	case EventStdout, EventStderr:
		m["text"] = e.Text
		m["timestamp"] = time.Now().UTC().Format(time.RFC3339Nano)
	case EventResult:
		for k, v := range e.Result {
			m[k] = v
		}
		m["is_main_result"] = e.Main
	case EventError:
		m["name"], m["value"], m["traceback"] = e.Name, e.Value, e.Traceback
	case EventCount:
		m["execution_count"] = e.Count
	case EventEnd:
		if e.TimedOut {
			m["timed_out"] = true
		}
		if e.Truncated > 0 {
			m["output_truncated"] = e.Truncated
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads a line MarshalJSON wrote.
func (e *Event) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*e = Event{}
	str := func(k string) string {
		var s string
		json.Unmarshal(m[k], &s)
		return s
	}
	e.Type = str("type")
	switch e.Type {
	case EventStdout, EventStderr:
		e.Text = str("text")
	case EventResult:
		json.Unmarshal(m["is_main_result"], &e.Main)
		e.Result = map[string]any{}
		for k, v := range m {
			if k == "type" || k == "is_main_result" {
				continue
			}
			var x any
			if err := json.Unmarshal(v, &x); err != nil {
				return err
			}
			e.Result[k] = x
		}
	case EventError:
		e.Name, e.Value, e.Traceback = str("name"), str("value"), str("traceback")
	case EventCount:
		json.Unmarshal(m["execution_count"], &e.Count)
	case EventEnd:
		json.Unmarshal(m["timed_out"], &e.TimedOut)
		json.Unmarshal(m["output_truncated"], &e.Truncated)
	}
	return nil
}

// mimeFields maps the MIME types of a display bundle to E2B's result
// fields; other types go to "extra" under their MIME name.
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	mimeData:                 "data",
	mimeChart:                "chart",
}

// The MIME types the kernel's start-up code (setup.py) adds for data
// frames (a dict of column lists) and for matplotlib figures (E2B's chart
// structure).
const (
	mimeData  = "application/vnd.corral.data+json"
	mimeChart = "application/vnd.corral.chart+json"
)

// resultFields turns a Jupyter MIME bundle into a result's fields.
func resultFields(bundle map[string]any) map[string]any {
	out := map[string]any{}
	var extra map[string]any
	for mime, v := range bundle {
		field, ok := mimeFields[mime]
		if !ok {
			if extra == nil {
				extra = map[string]any{}
			}
			extra[mime] = v
			continue
		}
		if s, ok := v.(string); ok && field == "text" {
			v = unquote(s)
		}
		if s, ok := v.(string); ok && (field == "png" || field == "jpeg") {
			// Jupyter wraps base64 at 76 columns; E2B's field is one line.
			v = strings.ReplaceAll(s, "\n", "")
		}
		if v == nil {
			continue
		}
		out[field] = v
	}
	if extra != nil {
		out["extra"] = extra
	}
	return out
}

// unquote strips the quotes of a string's repr ('abc' -> abc), as E2B
// does for a result's text.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] && !strings.ContainsRune(s[1:len(s)-1], rune(s[0])) {
		return s[1 : len(s)-1]
	}
	return s
}
