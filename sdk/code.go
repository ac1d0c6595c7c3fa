package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// CodeOptions are the inputs of RunCode. Context and Language are
// exclusive; neither runs the code on the default Python context.
type CodeOptions struct {
	// Context is a context's id (CreateCodeContext).
	Context string
	// Language is "python", "javascript" or "bash": the default context
	// of that language runs the code.
	Language string
	// Env is added to the environment for this execution only.
	Env map[string]string
	// Timeout, if not 0, interrupts the execution; the context and its
	// variables stay.
	Timeout time.Duration
	// MaxOutputBytes bounds the stdout and stderr received (0: 8 MiB).
	MaxOutputBytes int64
	// OnStdout, OnStderr, OnResult and OnError, if set, see each event as
	// it arrives; the Execution holds them all at the end too.
	OnStdout func(text string)
	OnStderr func(text string)
	OnResult func(Result)
	OnError  func(ExecutionError)
}

// Result is one rich result of an execution: the value of the last
// expression (IsMain) or a display (a chart, an image, a table). Each
// field is one representation; those the result does not have are empty.
type Result struct {
	IsMain     bool   `json:"-"`
	Text       string `json:"text,omitempty"`
	HTML       string `json:"html,omitempty"`
	Markdown   string `json:"markdown,omitempty"`
	SVG        string `json:"svg,omitempty"`
	PNG        string `json:"png,omitempty"` // base64
	JPEG       string `json:"jpeg,omitempty"`
	PDF        string `json:"pdf,omitempty"`
	LaTeX      string `json:"latex,omitempty"`
	JSON       any    `json:"json,omitempty"`
	JavaScript string `json:"javascript,omitempty"`
	// Data is a data frame as its columns (name -> values).
	Data map[string]any `json:"data,omitempty"`
	// Chart is a matplotlib figure's structure: type (line, scatter, bar,
	// pie, superchart, unknown), title, elements and axes.
	Chart map[string]any `json:"chart,omitempty"`
	// Extra holds other MIME types, by name.
	Extra map[string]any `json:"extra,omitempty"`
}

// ExecutionError is an error the executed code raised; Name is
// "DeadKernelError" when the context's kernel died (RestartCodeContext).
type ExecutionError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *ExecutionError) Error() string { return e.Name + ": " + e.Value }

// Execution is what RunCode collected.
type Execution struct {
	Results []Result
	Stdout  []string
	Stderr  []string
	// Error is set when the code raised.
	Error          *ExecutionError
	ExecutionCount int
	TimedOut       bool
	// OutputDiscarded counts the output bytes past MaxOutputBytes.
	OutputDiscarded int64
}

// Text is the text of the main result, "" without one.
func (x *Execution) Text() string {
	for _, r := range x.Results {
		if r.IsMain {
			return r.Text
		}
	}
	return ""
}

// CodeContext is a context of a sandbox's code interpreter: one kernel,
// with its variables and working directory.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

type codeEvent struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Result    json.RawMessage `json:"result"`
	Main      bool            `json:"main"`
	Exception *ExecutionError `json:"exception"`
	Count     int             `json:"execution_count"`
	TimedOut  bool            `json:"timed_out"`
	Discarded int64           `json:"output_discarded"`
	Error     *Error          `json:"error"`
}

func codePath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/code" }

// RunCode runs code in sandbox id's code interpreter (a sandbox of a
// code-interpreter template) and returns what it printed and produced.
// An error is returned when the execution could not run (unknown context:
// CodeNotFound; no interpreter: CodeFailedPrecondition), not when the
// code raised: that is Execution.Error.
func (c *Client) RunCode(ctx context.Context, id, code string, opts CodeOptions) (*Execution, error) {
	b, err := json.Marshal(map[string]any{
		"code": code, "context_id": opts.Context, "language": opts.Language, "env": opts.Env,
		"timeout_ms": opts.Timeout.Milliseconds(), "max_output_bytes": opts.MaxOutputBytes,
	})
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, "POST", codePath(id), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := newEventScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	x := &Execution{}
	for sc.Scan() {
		var ev codeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decoding code event: %w", err)
		}
		switch ev.Type {
		case "stdout":
			x.Stdout = append(x.Stdout, ev.Text)
			if opts.OnStdout != nil {
				opts.OnStdout(ev.Text)
			}
		case "stderr":
			x.Stderr = append(x.Stderr, ev.Text)
			if opts.OnStderr != nil {
				opts.OnStderr(ev.Text)
			}
		case "result":
			var r Result
			if err := json.Unmarshal(ev.Result, &r); err != nil {
				return nil, fmt.Errorf("decoding result: %w", err)
			}
			r.IsMain = ev.Main
			x.Results = append(x.Results, r)
			if opts.OnResult != nil {
				opts.OnResult(r)
			}
		case "exception":
			x.Error = ev.Exception
			if opts.OnError != nil && ev.Exception != nil {
				opts.OnError(*ev.Exception)
			}
		case "end":
			x.ExecutionCount, x.TimedOut, x.OutputDiscarded = ev.Count, ev.TimedOut, ev.Discarded
			return x, nil
		case "error":
			if ev.Error == nil {
				return nil, &Error{Code: CodeInternal, Message: "code stream failed"}
			}
			return nil, ev.Error
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading code stream: %w", err)
	}
	return nil, &Error{Code: CodeUnavailable, Message: "code stream ended before the execution did"}
}

// CodeContexts lists the contexts of sandbox id's code interpreter.
func (c *Client) CodeContexts(ctx context.Context, id string) ([]CodeContext, error) {
	var out []CodeContext
	return out, c.doJSON(ctx, "GET", codePath(id)+"/contexts", nil, nil, &out)
}

// CreateCodeContext starts a context for language ("" is python) in
// directory cwd ("" is the user's home).
func (c *Client) CreateCodeContext(ctx context.Context, id, language, cwd string) (*CodeContext, error) {
	var out CodeContext
	in := map[string]string{"language": language, "cwd": cwd}
	if err := c.doJSON(ctx, "POST", codePath(id)+"/contexts", nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RestartCodeContext starts context cid's kernel anew: its variables are
// gone, and a context whose kernel died runs code again.
func (c *Client) RestartCodeContext(ctx context.Context, id, cid string) error {
	return c.doJSON(ctx, "POST", codePath(id)+"/contexts/"+url.PathEscape(cid)+"/restart", nil, nil, nil)
}

// DeleteCodeContext stops context cid.
func (c *Client) DeleteCodeContext(ctx context.Context, id, cid string) error {
	return c.doJSON(ctx, "DELETE", codePath(id)+"/contexts/"+url.PathEscape(cid), nil, nil, nil)
}
