package interpreter

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// kernelJS is the JavaScript kernel's program (kernel.js).
//
//go:embed kernel.js
var kernelJS string

// streamKernel is a kernel whose output is its process's stdout and
// stderr, read directly: the Node.js kernel (kernel.js) and the bash
// kernel. After each execution the process writes mark to both streams,
// and one line on its event pipe: for node a JSON event stream ending in
// {"type":"done"}, for bash the exit status of the cell. An execution is
// over once the last event and both marks have arrived, so that no output
// of one execution is reported with the next.
type streamKernel struct {
	*proc
	language string
	mark     []byte
	// requests is where executions are sent: the node kernel's fd 3, the
	// stdin of bash.
	requests io.WriteCloser
	// output carries the chunks of both streams; events the kernel's
	// event lines. Their reader goroutines end when the process closes the
	// pipes (at its exit).
	output chan chunk
	events chan []byte
	// cellDir holds the bash kernel's cells.
	cellDir string
}

// chunk is output read from one stream; mark is set when the stream's
// marker was reached (data, if any, came before it).
type chunk struct {
	stderr bool
	data   []byte
	mark   bool
}

// startNode starts `node -e <kernel.js>` with fd 3 for requests and fd 4
// for events, and waits for its "ready" event.
func startNode(ctx context.Context, cfg kernelConfig) (kernel, error) {
	mark := newMark()
	cmd := exec.Command(cfg.tools.Node, "-e", kernelJS)
	cfg.env = append(cfg.env, "CORRAL_KERNEL_MARK="+mark)
	k, err := startStreamKernel(ctx, cmd, cfg, mark)
	if err != nil {
		return nil, err
	}
	select {
	case line, ok := <-k.events:
		if ok && strings.Contains(string(line), `"ready"`) {
			return k, nil
		}
	case <-ctx.Done():
	case <-time.After(kernelStartTimeout):
	}
	k.kill()
	return nil, fmt.Errorf("starting the JavaScript kernel: %w", k.died())
}

// bashPrelude is what the bash kernel runs before its first cell. An
// interrupt (SIGINT to the process group) ends the command running, and
// the trap's return then leaves the sourced cell, so that the rest of the
// cell does not run and the shell stays alive.
//
// The marks go to copies of the shell's stdout and stderr made before any
// cell ran, so that a cell that redirects its shell's output (exec >file)
// does not keep its execution from ending.
const bashPrelude = "trap 'return 130' INT\nexec {__corral_out}>&1 {__corral_err}>&2\n"

// startBash starts bash reading commands from a pipe, with fd 3 for the
// exit status of each cell.
func startBash(ctx context.Context, cfg kernelConfig) (kernel, error) {
	mark := newMark()
	// The cells are written by the service, which may run as root while
	// the kernel does not: their directory is the service's own, in the
	// system's sticky temporary directory, so that no code in a kernel can
	// swap it or the cell for a link that root would write through.
	dir, err := os.MkdirTemp("", "corral-cells-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(cfg.tools.Bash, "--noprofile", "--norc")
	k, err := startStreamKernel(ctx, cmd, cfg, mark)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	k.cellDir = dir
	prelude := bashPrelude + "__corral_mark=" + bashQuote(mark) + "\n"
	if _, err := io.WriteString(k.requests, prelude); err != nil {
		k.kill()
		return nil, fmt.Errorf("starting the bash kernel: %w", k.died())
	}
	return k, nil
}

// startStreamKernel starts cmd with pipes for stdin (bash) or fd 3
// (node), stdout, stderr and an event pipe (fd 3 for bash, 4 for node).
func startStreamKernel(_ context.Context, cmd *exec.Cmd, cfg kernelConfig, mark string) (_ *streamKernel, err error) {
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	pipe := func() (r, w *os.File) {
		if err != nil {
			return nil, nil
		}
		r, w, err = os.Pipe()
		if err == nil {
			closers = append(closers, r, w)
		}
		return r, w
	}
	outR, outW := pipe()
	errR, errW := pipe()
	evR, evW := pipe()
	reqR, reqW := pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	k := &streamKernel{language: cfg.language, mark: []byte(mark),
		output: make(chan chunk, 256), events: make(chan []byte, 64)}
	if cfg.language == LangBash {
		cmd.Stdin = reqR
		cmd.ExtraFiles = []*os.File{evW}
	} else {
		cmd.Stdin = nil
		cmd.ExtraFiles = []*os.File{reqR, evW}
	}
	p, err := startProc(cmd, cfg)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	// The child has its ends; the service keeps the others.
	closers = []io.Closer{outW, errW, evW, reqR}
	k.proc, k.requests = p, reqW
	go k.readOutput(outR, false)
	go k.readOutput(errR, true)
	go k.readEvents(evR)
	return k, nil
}

// newMark is a marker no output contains by accident: a control
// character, then random letters.
func newMark() string { return "\x1ecorral-" + randomHex(12) + "\x1e" }

// readOutput reads one stream into k.output, splitting it at the marks.
// Bytes that may be the start of a mark are held back until the next read
// tells.
func (k *streamKernel) readOutput(r *os.File, stderr bool) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	var pending []byte
	send := func(c chunk) bool {
		select {
		case k.output <- c:
			return true
		case <-k.done():
			return false
		}
	}
	for {
		n, err := r.Read(buf)
		data := append(pending, buf[:n]...)
		pending = nil
		for {
			i := bytes.Index(data, k.mark)
			if i < 0 {
				break
			}
			if !send(chunk{stderr: stderr, data: bytes.Clone(data[:i]), mark: true}) {
				return
			}
			data = data[i+len(k.mark):]
		}
		hold := markPrefix(data, k.mark)
		hold += partialRune(data[:len(data)-hold])
		if len(data)-hold > 0 && !send(chunk{stderr: stderr, data: bytes.Clone(data[:len(data)-hold])}) {
			return
		}
		pending = bytes.Clone(data[len(data)-hold:])
		if err != nil {
			if len(pending) > 0 {
				send(chunk{stderr: stderr, data: pending})
			}
			return
		}
	}
}

// markPrefix is the length of the longest end of data that is a proper
// start of mark.
func markPrefix(data, mark []byte) int {
	n := min(len(data), len(mark)-1)
	for ; n > 0; n-- {
		if bytes.HasSuffix(data, mark[:n]) {
			return n
		}
	}
	return 0
}

// partialRune is the length of an incomplete UTF-8 sequence at the end of
// data, held back so that a character split between two reads reaches
// the client whole.
func partialRune(data []byte) int {
	for n := 1; n <= min(3, len(data)); n++ {
		b := data[len(data)-n]
		if utf8.RuneStart(b) {
			if b >= utf8.RuneSelf && !utf8.FullRune(data[len(data)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

func (k *streamKernel) readEvents(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxFrame)
	for sc.Scan() {
		select {
		case k.events <- bytes.Clone(sc.Bytes()):
		case <-k.done():
			return
		}
	}
}

func (k *streamKernel) run(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	// Output that arrived between executions (a background process's)
	// belongs to none of them.
	for drained := false; !drained; {
		select {
		case <-k.output:
		default:
			drained = true
		}
	}
	if err := k.send(code, env); err != nil {
		select {
		case <-k.done():
			return 0, k.died()
		default:
			return 0, err
		}
	}
	var (
		marks, count int
		finished     bool
		cancel       = ctx.Done()
		grace        <-chan time.Time
	)
	for !finished || marks < 2 {
		select {
		case c := <-k.output:
			if len(c.data) > 0 {
				typ := EventStdout
				if c.stderr {
					typ = EventStderr
				}
				emit(Event{Type: typ, Text: string(c.data)})
			}
			if c.mark {
				marks++
			}
		case line := <-k.events:
			var done bool
			done, count = k.event(line, emit)
			finished = finished || done
		case <-cancel:
			cancel = nil
			k.signal(syscall.SIGINT)
			grace = settle()
		case <-grace:
			k.kill()
			return 0, fmt.Errorf("%w: it did not stop within %s of an interrupt", errKernelDied, interruptGrace)
		case <-k.done():
			return 0, k.died()
		}
	}
	return count, nil
}

// send writes one execution request.
func (k *streamKernel) send(code string, env map[string]string) error {
	if k.language != LangBash {
		b, err := json.Marshal(map[string]any{"code": code, "env": env})
		if err != nil {
			return err
		}
		_, err = k.requests.Write(append(b, '\n'))
		return err
	}
	cell := filepath.Join(k.cellDir, "cell.sh")
	if err := os.WriteFile(cell, []byte(code+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the cell: %w", err)
	}
	_, err := io.WriteString(k.requests, bashCommand(cell, env))
	return err
}

// bashCommand is the line that runs one cell: env exported for its
// duration (and put back after), its stdin /dev/null so that it cannot
// read the kernel's own commands, then the marks and the status.
func bashCommand(cell string, env map[string]string) string {
	var pre, post strings.Builder
	i := 0
	for name, v := range env {
		set, old := "__corral_set"+strconv.Itoa(i), "__corral_old"+strconv.Itoa(i)
		fmt.Fprintf(&pre, "%s=${%s+1}; %s=${%s-}; export %s=%s; ", set, name, old, name, name, bashQuote(v))
		fmt.Fprintf(&post, "if [ -n \"$%s\" ]; then export %s=\"$%s\"; else unset %s; fi; unset %s %s; ", set, name, old, name, set, old)
		i++
	}
	return pre.String() + "source " + bashQuote(cell) + " </dev/null; __corral_s=$?; " + post.String() +
		"printf '%s' \"$__corral_mark\" >&$__corral_out; printf '%s' \"$__corral_mark\" >&$__corral_err; printf '%s\\n' \"$__corral_s\" >&3\n"
}

// bashQuote quotes s as one bash word.
func bashQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// event handles one line of the event pipe and says whether it ended the
// execution, with the execution count.
func (k *streamKernel) event(line []byte, emit func(Event)) (bool, int) {
	if k.language == LangBash {
		status, _ := strconv.Atoi(strings.TrimSpace(string(line)))
		if status != 0 {
			emit(Event{Type: EventError, Name: "ExitStatus", Value: strconv.Itoa(status),
				Traceback: fmt.Sprintf("the cell's last command exited with status %d", status)})
		}
		return true, 0
	}
	var ev struct {
		Type           string         `json:"type"`
		Text           string         `json:"text"`
		JSON           any            `json:"json"`
		Name           string         `json:"name"`
		Value          string         `json:"value"`
		Traceback      string         `json:"traceback"`
		ExecutionCount int            `json:"execution_count"`
		Data           map[string]any `json:"data"`
	}
	if json.Unmarshal(line, &ev) != nil {
		return false, 0
	}
	switch ev.Type {
	case "result":
		r := map[string]any{"text": ev.Text}
		if ev.JSON != nil {
			r["json"] = ev.JSON
		}
		emit(Event{Type: EventResult, Result: r, Main: true})
	case "error":
		emit(Event{Type: EventError, Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback})
	case "done":
		return true, ev.ExecutionCount
	}
	return false, 0
}

func (k *streamKernel) kill() {
	k.proc.kill()
	k.requests.Close()
	if k.cellDir != "" {
		os.RemoveAll(k.cellDir)
	}
}
