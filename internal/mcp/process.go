package mcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// ProcessStartIn is the input of process_start.
type ProcessStartIn struct {
	Command   string            `json:"command" jsonschema:"the shell command, run with /bin/sh -c"`
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	User      string            `json:"user,omitempty" jsonschema:"user to run as (name or uid); default root"`
	Tag       string            `json:"tag,omitempty" jsonschema:"a label shown by process_list"`
	Timeout   int               `json:"timeout_seconds,omitempty" jsonschema:"kill the process after this many seconds; default: never"`
}

func (s *Server) processStart(ctx context.Context, st *session, in ProcessStartIn) (*mcp.CallToolResult, error) {
	if strings.TrimSpace(in.Command) == "" {
		return nil, invalid("command is empty")
	}
	timeout, err := seconds("timeout_seconds", in.Timeout, 30*24*3600)
	if err != nil {
		return nil, err
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	p, err := st.client.StartProcess(ctx, id, corral.StartOptions{Shell: in.Command, Env: in.Env, Cwd: in.Cwd, User: in.User,
		Tag: in.Tag, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("started pid %d in %s; read its output with process_output pid=%d\n", p.PID, id, p.PID),
		map[string]any{"sandbox_id": id, "pid": p.PID}), nil
}

// ProcessOutputIn is the input of process_output.
type ProcessOutputIn struct {
	PID       int    `json:"pid" jsonschema:"the process, from process_start"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
	Offset    int64  `json:"offset,omitempty" jsonschema:"byte offset into everything the process wrote; pass the last next_offset to read on; default 0"`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"bytes to return; default 10000"`
	Wait      int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds for output past offset or for the process to end; default 0, at most 300"`
}

// keepWriter keeps the first limit bytes written to it and discards the
// rest, so a read returns the output right after its offset.
type keepWriter struct {
	buf   []byte
	limit int
}

func (w *keepWriter) Write(p []byte) (int, error) {
	if room := w.limit - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (s *Server) processOutput(ctx context.Context, st *session, in ProcessOutputIn) (*mcp.CallToolResult, error) {
	if in.PID <= 0 {
		return nil, invalid("pid is required")
	}
	if in.Offset < 0 {
		return nil, invalid("offset must not be negative")
	}
	limit, err := outputLimit(in.MaxBytes)
	if err != nil {
		return nil, invalid("max_bytes must be between 1 and %d", maxOutput)
	}
	wait, err := seconds("wait_seconds", in.Wait, 300)
	if err != nil {
		return nil, err
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	w := &keepWriter{limit: limit}
	res, err := st.client.Output(ctx, id, in.PID, corral.OutputOptions{From: in.Offset, Stdout: w, Stderr: w})
	if err != nil {
		return nil, err
	}
	// What w holds starts where the kept output resumed after any bytes
	// lost to the buffer's limit.
	start, dropped := res.Start, res.Start-in.Offset
	if len(w.buf) == 0 && res.Exit == nil && wait > 0 {
		// Nothing new yet: follow until the first output, the exit or
		// the end of the wait.
		wctx, cancel := context.WithTimeout(ctx, wait)
		more, err := st.client.Output(wctx, id, in.PID, corral.OutputOptions{From: res.Next, Follow: true,
			Stdout: firstWrite{w, cancel}, Stderr: firstWrite{w, cancel}})
		cancel()
		switch {
		case err == nil:
			start = more.Start
			dropped += more.Start - res.Next
		case ctx.Err() == nil && wctx.Err() != nil:
			// The wait ended, or the first output ended it.
			start = res.Next
		default:
			return nil, err
		}
	}
	if len(w.buf) == w.limit {
		// More may follow: end at a character's start, where the next
		// read begins.
		w.buf = cutRune(w.buf)
	}
	next := start + int64(len(w.buf))
	p, err := st.client.Process(ctx, id, in.PID)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&b, "note: %d bytes before this output are gone (only the last 1 MiB is kept)\n", dropped)
	}
	text := validText(w.buf)
	b.WriteString(text)
	if text != "" && !strings.HasSuffix(text, "\n") {
		b.WriteString("\n")
	}
	structured := map[string]any{"sandbox_id": id, "pid": in.PID, "output": text, "next_offset": next,
		"running": p.Running, "output_bytes": p.OutputBytes}
	switch {
	case p.Running:
		fmt.Fprintf(&b, "[pid %d is running; ", in.PID)
	case p.ExitCode != nil:
		fmt.Fprintf(&b, "[pid %d exited with code %d; ", in.PID, *p.ExitCode)
		structured["exit_code"] = *p.ExitCode
	default:
		fmt.Fprintf(&b, "[pid %d has ended; ", in.PID)
	}
	if p.OutputBytes > next {
		fmt.Fprintf(&b, "%d more bytes to read: next_offset=%d]\n", p.OutputBytes-next, next)
	} else {
		fmt.Fprintf(&b, "next_offset=%d]\n", next)
	}
	return textResult(b.String(), structured), nil
}

// firstWrite passes writes on and, after the first, ends the wait: a
// poll returns as soon as there is something new.
type firstWrite struct {
	w    *keepWriter
	stop context.CancelFunc
}

func (f firstWrite) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.stop()
	return n, err
}

// ProcessIn names a sandbox, for process_list.
type ProcessIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) processList(ctx context.Context, st *session, in ProcessIn) (*mcp.CallToolResult, error) {
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	ps, err := st.client.Processes(ctx, id)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	items := []map[string]any{}
	for _, p := range ps {
		state := "running"
		if !p.Running {
			state = "exited"
			if p.ExitCode != nil {
				state = fmt.Sprintf("exited %d", *p.ExitCode)
			}
		}
		fmt.Fprintf(&b, "pid %d  %s  %s", p.PID, state, strings.Join(p.Cmd, " "))
		if p.Tag != "" {
			fmt.Fprintf(&b, "  [%s]", p.Tag)
		}
		fmt.Fprintf(&b, "  (%d bytes of output, started %s ago)\n", p.OutputBytes, time.Since(p.StartedAt).Round(time.Second))
		item := map[string]any{"pid": p.PID, "cmd": p.Cmd, "running": p.Running, "tag": p.Tag, "output_bytes": p.OutputBytes}
		if p.ExitCode != nil {
			item["exit_code"] = *p.ExitCode
		}
		items = append(items, item)
	}
	if len(ps) == 0 {
		b.WriteString("no processes\n")
	}
	return textResult(b.String(), map[string]any{"sandbox_id": id, "processes": items}), nil
}

// ProcessKillIn is the input of process_kill.
type ProcessKillIn struct {
	PID       int    `json:"pid" jsonschema:"the process"`
	Signal    string `json:"signal,omitempty" jsonschema:"SIGKILL (default), SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) processKill(ctx context.Context, st *session, in ProcessKillIn) (*mcp.CallToolResult, error) {
	if in.PID <= 0 {
		return nil, invalid("pid is required")
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	sig := strings.ToUpper(strings.TrimSpace(in.Signal))
	if sig == "" || sig == "SIGKILL" || sig == "KILL" {
		err = st.client.Kill(ctx, id, in.PID)
		sig = "SIGKILL"
	} else {
		err = st.client.Signal(ctx, id, in.PID, sig)
	}
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("sent %s to pid %d\n", sig, in.PID), map[string]any{"sandbox_id": id, "pid": in.PID, "signal": sig}), nil
}
