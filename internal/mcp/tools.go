package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// toolFunc is a tool's work: its session and arguments in, a result or an
// error out. Errors become tool errors (failure), never protocol errors.
type toolFunc[In any] func(ctx context.Context, st *session, in In) (*mcp.CallToolResult, error)

// kind says what a tool does to the world, for the client's annotations
// (which it may use to ask the user before a call).
type kind int

const (
	reads      kind = iota // changes nothing
	writes                 // changes a sandbox
	destroys               // deletes something that cannot come back
	creates                // makes sandboxes or snapshots
	idempotent             // changes state, the same way when repeated
)

// addTool registers a tool whose input schema is inferred from In. It
// checks the arguments against the schema itself, rather than through the
// SDK's typed handlers, so that arguments that do not fit fail like every
// other bad input: a tool error with code invalid_argument.
func addTool[In any](s *Server, name, title, description string, k kind, h toolFunc[In]) {
	closed := false
	ann := &mcp.ToolAnnotations{Title: title, OpenWorldHint: &closed}
	switch k {
	case reads:
		ann.ReadOnlyHint, ann.IdempotentHint = true, true
	case destroys:
		yes := true
		ann.DestructiveHint = &yes
		ann.IdempotentHint = true
	case idempotent:
		no := false
		ann.DestructiveHint, ann.IdempotentHint = &no, true
	case creates:
		no := false
		ann.DestructiveHint = &no
	}
	schema, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("schema of tool %s: %v", name, err)) // a programming error, found by any test
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("schema of tool %s: %v", name, err))
	}
	s.mcp.AddTool(&mcp.Tool{Name: name, Title: title, Description: description, Annotations: ann, InputSchema: schema},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(s.calls, cancel)()
			in, err := arguments[In](req.Params.Arguments, resolved)
			if err != nil {
				return failure(err), nil
			}
			st, err := s.state(req)
			if err != nil {
				return failure(err), nil
			}
			res, err := h(ctx, st, in)
			if err != nil {
				res = failure(err)
			}
			if st.takeReplaced() {
				note := fmt.Sprintf("note: this session's sandbox was gone (deleted, or unused for %s), so a new, empty one was made: files and processes of the old one are lost\n",
					s.cfg.Policy.SessionIdle)
				res.Content = append([]mcp.Content{&mcp.TextContent{Text: note}}, res.Content...)
			}
			return res, nil
		})
}

// arguments checks a call's arguments against the tool's schema and
// decodes them.
func arguments[In any](raw json.RawMessage, schema *jsonschema.Resolved) (In, error) {
	var in In
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return in, invalid("arguments are not JSON: %v", err)
	}
	if err := schema.Validate(v); err != nil {
		return in, invalid("arguments do not fit the tool's input schema: %v", err)
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return in, invalid("arguments: %v", err)
	}
	return in, nil
}

// seconds converts a tool's whole-seconds argument, checking its range.
func seconds(name string, n, max int) (time.Duration, error) {
	if n < 0 || n > max {
		return 0, invalid("%s must be between 0 and %d", name, max)
	}
	return time.Duration(n) * time.Second, nil
}

func (s *Server) addTools() {
	addTool(s, "exec", "Run a shell command",
		"Run a shell command (with /bin/sh -c) in a sandbox and wait for it to end. Returns its exit code, stdout and stderr; long output keeps its start and end. "+
			"Without sandbox_id it runs in this session's own sandbox, which keeps files and installed packages between calls. "+
			"For servers and other work that runs longer than timeout_seconds, use process_start.",
		writes, s.exec)
	addTool(s, "run_code", "Run code in an interpreter",
		"Run Python (default), JavaScript or bash code in a stateful interpreter, like a Jupyter notebook cell: variables and imports stay for the next call in the same context. "+
			"Returns stdout, stderr, the value of the last expression, errors with their traceback, and charts and images as images. "+
			"Needs a sandbox whose template has the code interpreter.",
		writes, s.runCode)
	addTool(s, "code_context_create", "Create an interpreter context",
		"Create a new, separate interpreter context (its own variables and working directory) for run_code, and return its context_id.",
		creates, s.codeContextCreate)

	addTool(s, "sandbox_create", "Create a sandbox",
		"Create a new sandbox and return its sandbox_id, to pass to the other tools. Everything is optional: the defaults are the operator's. "+
			"A sandbox lives until sandbox_kill or its timeout.",
		creates, s.sandboxCreate)
	addTool(s, "sandbox_list", "List sandboxes",
		"List the sandboxes you can use, with their state; the one marked 'session' is this session's own.",
		reads, s.sandboxList)
	addTool(s, "sandbox_kill", "Delete a sandbox",
		"Delete a sandbox and everything in it, at once. This cannot be undone.",
		destroys, s.sandboxKill)
	addTool(s, "sandbox_pause", "Pause a sandbox",
		"Freeze a running sandbox's processes; it uses no CPU until sandbox_resume. Its memory and files are kept.",
		idempotent, s.sandboxPause)
	addTool(s, "sandbox_resume", "Resume a sandbox",
		"Resume a paused sandbox (or start a stopped one): its processes continue where they were.",
		idempotent, s.sandboxResume)
	addTool(s, "snapshot", "Snapshot a sandbox",
		"Save a sandbox's filesystem (and, where the runtime can, its memory and processes) as a named snapshot. "+
			"Start new sandboxes from it with sandbox_create's from_snapshot.",
		creates, s.snapshot)
	addTool(s, "fork", "Fork a sandbox",
		"Make count copies of a running sandbox, each with its own copy of the files (and running processes where the runtime can), and return their sandbox_ids. "+
			"Use it to try several approaches from the same starting point.",
		creates, s.fork)

	addTool(s, "files_read", "Read a file",
		"Read a file in a sandbox. Text comes back as text (a part of it with offset and length), images as images, other binary files as base64.",
		reads, s.filesRead)
	addTool(s, "files_write", "Write a file",
		"Write a file in a sandbox, replacing it if it exists and creating its parent directories.",
		writes, s.filesWrite)
	addTool(s, "files_list", "List a directory",
		"List a directory in a sandbox: type, size and name of each entry.",
		reads, s.filesList)
	addTool(s, "files_remove", "Remove a file",
		"Remove a file, or a directory with recursive set.",
		destroys, s.filesRemove)

	addTool(s, "process_start", "Start a background process",
		"Start a shell command in the background and return its pid at once. Its output is kept (the last 1 MiB) for process_output, and it keeps running between calls. "+
			"Use it for servers, watchers and long builds.",
		writes, s.processStart)
	addTool(s, "process_output", "Read a process's output",
		"Read what a process started with process_start wrote (stdout and stderr in order) from offset, and whether it still runs. "+
			"Pass the returned next_offset to read on; wait_seconds waits for new output or its exit.",
		reads, s.processOutput)
	addTool(s, "process_list", "List processes",
		"List the processes started in a sandbox with process_start (and running exec commands), with their pid and state.",
		reads, s.processList)
	addTool(s, "process_kill", "Stop a process",
		"Send a signal to a process started with process_start: SIGKILL by default, or SIGTERM, SIGINT, SIGHUP...",
		destroys, s.processKill)

	addTool(s, "port_url", "URL of a port",
		"Return the URL at which the daemon forwards HTTP (and WebSocket) requests to a TCP port in a sandbox, for a server started there.",
		reads, s.portURL)
}

// ExecIn is the input of exec.
type ExecIn struct {
	Command   string            `json:"command" jsonschema:"the shell command, run with /bin/sh -c"`
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"the sandbox to run in; default: this session's own sandbox"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"text written to the command's standard input"`
	User      string            `json:"user,omitempty" jsonschema:"user to run as (name or uid); default root"`
	Timeout   int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 120, at most 3600"`
	MaxOutput int               `json:"max_output_bytes,omitempty" jsonschema:"bytes of stdout and of stderr returned; default 10000"`
}

func (s *Server) exec(ctx context.Context, st *session, in ExecIn) (*mcp.CallToolResult, error) {
	if strings.TrimSpace(in.Command) == "" {
		return nil, invalid("command is empty")
	}
	timeout, err := seconds("timeout_seconds", in.Timeout, 3600)
	if err != nil {
		return nil, err
	}
	if timeout == 0 {
		timeout = 120 * time.Second
	}
	limit, err := outputLimit(in.MaxOutput)
	if err != nil {
		return nil, err
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	stdout, stderr := newClipWriter(limit), newClipWriter(limit)
	opts := corral.ExecOptions{Shell: in.Command, Env: in.Env, Cwd: in.Cwd, User: in.User, Timeout: timeout,
		Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		opts.Stdin = []byte(in.Stdin)
	}
	res, err := st.client.Exec(ctx, id, opts)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exit_code: %d\n", res.ExitCode)
	switch {
	case res.TimedOut:
		fmt.Fprintf(&b, "note: killed after %s (timeout_seconds); run long work with process_start\n", timeout)
	case res.OOMKilled:
		b.WriteString("note: killed for running out of memory\n")
	case res.Signal != "":
		fmt.Fprintf(&b, "note: ended by %s\n", res.Signal)
	}
	for _, o := range []struct {
		name string
		w    *clipWriter
	}{{"stdout", stdout}, {"stderr", stderr}} {
		if o.w.total == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s:\n%s", o.name, o.w.String())
		if !strings.HasSuffix(o.w.String(), "\n") {
			b.WriteString("\n")
		}
		if n := o.w.omitted(); n > 0 {
			fmt.Fprintf(&b, "note: %d of %d bytes of %s left out; to read all of it, redirect it to a file (cmd > /tmp/out.txt 2>&1) and read that with files_read, or run the command with process_start and read process_output\n",
				n, o.w.total, o.name)
		}
	}
	if res.OutputTruncated {
		fmt.Fprintf(&b, "note: the daemon discarded %d bytes of output past its limit\n", res.OutputDiscarded)
	}
	return textResult(b.String(), map[string]any{"sandbox_id": id, "exit_code": res.ExitCode,
		"stdout": stdout.String(), "stderr": stderr.String(), "timed_out": res.TimedOut, "oom_killed": res.OOMKilled,
		"stdout_bytes": stdout.total, "stderr_bytes": stderr.total}), nil
}

// RunCodeIn is the input of run_code.
type RunCodeIn struct {
	Code      string            `json:"code" jsonschema:"the code to run"`
	Language  string            `json:"language,omitempty" jsonschema:"python (default), javascript or bash; ignored with context_id"`
	ContextID string            `json:"context_id,omitempty" jsonschema:"an interpreter context from code_context_create; default: the language's shared context"`
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"the sandbox to run in; default: this session's own sandbox"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables for this run only"`
	Timeout   int               `json:"timeout_seconds,omitempty" jsonschema:"interrupt the code after this many seconds (its variables stay); default 300, at most 3600"`
	MaxOutput int               `json:"max_output_bytes,omitempty" jsonschema:"bytes of stdout, of stderr and of each result returned; default 10000"`
}

func (s *Server) runCode(ctx context.Context, st *session, in RunCodeIn) (*mcp.CallToolResult, error) {
	if strings.TrimSpace(in.Code) == "" {
		return nil, invalid("code is empty")
	}
	timeout, err := seconds("timeout_seconds", in.Timeout, 3600)
	if err != nil {
		return nil, err
	}
	if timeout == 0 {
		timeout = 300 * time.Second
	}
	limit, err := outputLimit(in.MaxOutput)
	if err != nil {
		return nil, err
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	x, err := st.client.RunCode(ctx, id, in.Code, corral.CodeOptions{Context: in.ContextID, Language: in.Language,
		Env: in.Env, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	res := &mcp.CallToolResult{}
	var b strings.Builder
	if out := strings.Join(x.Stdout, ""); out != "" {
		fmt.Fprintf(&b, "stdout:\n%s\n", strings.TrimSuffix(clip(out, limit), "\n"))
	}
	if out := strings.Join(x.Stderr, ""); out != "" {
		fmt.Fprintf(&b, "stderr:\n%s\n", strings.TrimSuffix(clip(out, limit), "\n"))
	}
	var results []map[string]any
	for _, r := range x.Results {
		summary := map[string]any{"is_main": r.IsMain, "formats": formats(r)}
		label := "display"
		if r.IsMain {
			label = "result"
		}
		if text := resultText(r); text != "" {
			fmt.Fprintf(&b, "%s:\n%s\n", label, strings.TrimSuffix(clip(text, limit), "\n"))
			summary["text"] = clip(text, limit)
		}
		for _, img := range []struct{ data, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
			if img.data == "" {
				continue
			}
			data, err := decodeBase64(img.data)
			if err != nil {
				continue
			}
			res.Content = append(res.Content, &mcp.ImageContent{Data: data, MIMEType: img.mime})
			fmt.Fprintf(&b, "%s: an image (%s, %d bytes), attached\n", label, img.mime, len(data))
		}
		results = append(results, summary)
	}
	if x.Error != nil {
		fmt.Fprintf(&b, "error: %s: %s\n", x.Error.Name, x.Error.Value)
		if tb := plain(x.Error.Traceback); tb != "" {
			fmt.Fprintf(&b, "traceback:\n%s\n", strings.TrimSuffix(clip(tb, limit), "\n"))
		}
	}
	if x.TimedOut {
		fmt.Fprintf(&b, "note: interrupted after %s (timeout_seconds); the context's variables are kept\n", timeout)
	}
	if x.OutputDiscarded > 0 {
		fmt.Fprintf(&b, "note: %d bytes of output past the daemon's limit were discarded\n", x.OutputDiscarded)
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: b.String()}}, res.Content...)
	structured := map[string]any{"sandbox_id": id, "execution_count": x.ExecutionCount, "stdout": clip(strings.Join(x.Stdout, ""), limit),
		"stderr": clip(strings.Join(x.Stderr, ""), limit), "results": results, "timed_out": x.TimedOut}
	if x.Error != nil {
		structured["error"] = map[string]string{"name": x.Error.Name, "value": x.Error.Value, "traceback": clip(plain(x.Error.Traceback), limit)}
	}
	res.StructuredContent = structured
	return res, nil
}

// resultText is the best text form of a rich result for a model.
func resultText(r corral.Result) string {
	switch {
	case r.Text != "":
		return r.Text
	case r.Markdown != "":
		return r.Markdown
	case r.LaTeX != "":
		return r.LaTeX
	case r.HTML != "":
		return r.HTML
	case r.SVG != "":
		return r.SVG
	}
	return ""
}

// formats lists the representations a result has.
func formats(r corral.Result) []string {
	var f []string
	for _, c := range []struct {
		name string
		has  bool
	}{{"text", r.Text != ""}, {"html", r.HTML != ""}, {"markdown", r.Markdown != ""}, {"svg", r.SVG != ""},
		{"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"pdf", r.PDF != ""}, {"latex", r.LaTeX != ""},
		{"json", r.JSON != nil}, {"javascript", r.JavaScript != ""}, {"data", r.Data != nil}, {"chart", r.Chart != nil}} {
		if c.has {
			f = append(f, c.name)
		}
	}
	return append(f, slices.Sorted(maps.Keys(r.Extra))...)
}

// CodeContextIn is the input of code_context_create.
type CodeContextIn struct {
	Language  string `json:"language,omitempty" jsonschema:"python (default), javascript or bash"`
	Cwd       string `json:"cwd,omitempty" jsonschema:"the context's working directory"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) codeContextCreate(ctx context.Context, st *session, in CodeContextIn) (*mcp.CallToolResult, error) {
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	lang := in.Language
	if lang == "" {
		lang = "python"
	}
	cc, err := st.client.CreateCodeContext(ctx, id, lang, in.Cwd)
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("context_id: %s (%s, in %s)\n", cc.ID, cc.Language, cc.Cwd),
		map[string]any{"sandbox_id": id, "context_id": cc.ID, "language": cc.Language, "cwd": cc.Cwd}), nil
}

// portURL answers port_url.
func (s *Server) portURL(ctx context.Context, st *session, in PortIn) (*mcp.CallToolResult, error) {
	if in.Port < 1 || in.Port > 65535 {
		return nil, invalid("port must be between 1 and 65535")
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	if _, err := st.client.Get(ctx, id); err != nil {
		return nil, err
	}
	u := st.client.PortURL(id, in.Port)
	how := "Requests need the daemon's API key in the X-API-Key header (the daemon removes it before the request reaches the sandbox)."
	switch {
	case st.base != "":
		u = st.base + u[strings.Index(u, "/v1/"):]
	case s.cfg.UnixSocket != "":
		// Over the unix socket there is no URL a browser could open.
		u = "http://localhost" + u[strings.Index(u, "/v1/"):]
		how = "The daemon serves it on its unix socket only, e.g. curl --unix-socket " + s.cfg.UnixSocket + " " + u +
			"; serve the API over TCP (corral server --listen) for a URL other programs can open."
	}
	return textResult(fmt.Sprintf("url: %s\n%s\nThe server must listen on port %d inside the sandbox (127.0.0.1 or 0.0.0.0).\n", u, how, in.Port),
		map[string]any{"sandbox_id": id, "port": in.Port, "url": u}), nil
}

// PortIn is the input of port_url.
type PortIn struct {
	Port      int    `json:"port" jsonschema:"the TCP port the server listens on in the sandbox"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}
