package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	corral "github.com/corralrun/corral/sdk"
)

// loginShell starts the user's login shell as /etc/passwd names it, or
// /bin/sh when it names none that can run.
const loginShell = `s=
if [ -n "$USER" ] && [ -r /etc/passwd ]; then
  while IFS=: read -r n _ _ _ _ _ p; do [ "$n" = "$USER" ] && s=$p && break; done </etc/passwd
fi
case "$s" in ""|*/nologin|*/false) s=/bin/sh ;; esac
[ -x "$s" ] || s=/bin/sh
SHELL=$s; export SHELL
exec "$s" -l`

// shell runs an interactive PTY session: `corral shell [flags] ID [-- CMD...]`.
func (c *cli) shell(args []string) int {
	fs := c.flags("shell")
	var env multiFlag
	fs.Var(&env, "e", "environment variable KEY=VALUE (repeatable)")
	user := fs.String("user", "", "user to run as: name or uid[:gid] (default root)")
	cwd := fs.String("cwd", "", "working directory (default: the user's home)")
	before, cmd := splitCommand(args)
	if err := fs.Parse(before); err != nil {
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 || (len(cmd) > 0 && len(rest) > 1) {
		fmt.Fprintln(c.env.Stderr, "usage: corral shell [--user U] [--cwd DIR] [-e K=V] ID [-- CMD...]")
		return exitUsage
	}
	id := rest[0]
	if len(cmd) == 0 {
		cmd = rest[1:]
	}
	envMap, err := env.pairs("-e")
	if err != nil {
		return c.fail(err)
	}
	if _, ok := envMap["TERM"]; !ok {
		t := c.env.Getenv("TERM")
		if t == "" {
			t = "xterm"
		}
		if envMap == nil {
			envMap = map[string]string{}
		}
		envMap["TERM"] = t
	}
	tty := terminalOf(c.env.Stdin)
	size := terminalSize(tty)
	opts := corral.StartOptions{Cmd: cmd, Env: envMap, User: *user, Cwd: *cwd, PTY: &size, Tag: "shell"}
	if len(cmd) == 0 {
		opts.Shell = loginShell
	}

	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	p, err := client.StartProcess(ctx, id, opts)
	if err != nil {
		return c.fail(err)
	}
	// The session owns its shell: whatever ends it, the shell goes too.
	defer func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		_ = client.RemoveProcess(rctx, id, p.PID)
	}()
	res, err := c.session(ctx, client, id, p.PID, sessionOptions{tty: tty, in: c.env.Stdin, closeStdin: true})
	if err != nil {
		return c.fail(err)
	}
	return res.ExitCode
}

// sessionOptions shape a session.
type sessionOptions struct {
	// tty is the local terminal, set to raw mode and followed for resizes
	// while the session runs; nil for plain streams.
	tty *os.File
	// in is forwarded to the process's stdin; nil forwards nothing.
	in io.Reader
	// closeStdin closes the process's stdin when in ends.
	closeStdin bool
	// from is the output offset to replay from.
	from int64
	// detach, when set, is called when the detach key is typed on tty.
	detach context.CancelFunc
}

// session attaches the local terminal (or plain streams) to a process
// until it exits. The terminal is restored before session returns,
// whatever happens.
func (c *cli) session(ctx context.Context, client *corral.Client, id string, pid int, so sessionOptions) (*corral.ExecResult, error) {
	opts := corral.AttachOptions{From: so.from, Stdout: c.env.Stdout, Stderr: c.env.Stderr, CloseStdin: so.closeStdin}
	newline := "\n"
	if tty := so.tty; tty != nil {
		old, err := term.MakeRaw(int(tty.Fd()))
		if err != nil {
			return nil, fmt.Errorf("setting the terminal to raw mode: %w", err)
		}
		defer term.Restore(int(tty.Fd()), old)
		newline = "\r\n"
		sizes, stop := watchResize(tty)
		defer stop()
		opts.Resize = sizes
	}
	opts.OnError = func(err error) { fmt.Fprintf(c.env.Stderr, "corral: %v%s", err, newline) }
	if in := so.in; in != nil {
		if f, ok := in.(*os.File); ok {
			ci, err := newCancelableInput(f)
			if err != nil {
				return nil, err
			}
			// Runs before the terminal is restored: no read is left
			// pending that would eat the shell's next input.
			defer ci.Close()
			in = ci
		}
		if so.tty != nil && so.detach != nil {
			in = &detachInput{r: in, detach: so.detach}
		}
		opts.Stdin = in
	}
	return client.Attach(ctx, id, pid, opts)
}

// attach connects to a running process: `corral attach [-i] ID PID`.
func (c *cli) attach(args []string) int {
	fs := c.flags("attach")
	stdin := fs.Bool("i", false, "forward standard input (always on for PTY processes)")
	noStdin := fs.Bool("no-stdin", false, "do not forward standard input, even to a PTY process")
	from := fs.Int64("from", 0, "replay output from this byte offset (0: all that is buffered)")
	id, pid, code := c.idAndPID(fs, args, "usage: corral attach [-i] [--no-stdin] [--from N] ID PID")
	if code >= 0 {
		return code
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	p, err := client.Process(ctx, id, pid)
	if err != nil {
		return c.fail(err)
	}
	var tty *os.File
	if p.PTY {
		tty = terminalOf(c.env.Stdin)
	}
	var in io.Reader
	if (p.PTY || *stdin) && !*noStdin {
		in = c.env.Stdin
	}
	actx, detach := context.WithCancel(ctx)
	defer detach()
	if tty != nil {
		// Bring the remote terminal to this one's size first.
		_ = client.Resize(ctx, id, pid, terminalSize(tty))
		fmt.Fprintf(c.env.Stderr, "corral: attached to process %d; Ctrl-] detaches\n", pid)
	}
	res, err := c.session(actx, client, id, pid, sessionOptions{tty: tty, in: in, from: *from, detach: detach, closeStdin: !p.PTY})
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			fmt.Fprintf(c.env.Stderr, "\ncorral: detached; process %d keeps running\n", pid)
			return 0
		}
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return c.fail(err)
	}
	return res.ExitCode
}

// idAndPID parses "[flags] ID PID". code is -1 on success, else the exit
// code to return.
func (c *cli) idAndPID(fs *flag.FlagSet, args []string, usageLine string) (string, int, int) {
	if err := fs.Parse(args); err != nil {
		return "", 0, exitUsage
	}
	rest := fs.Args()
	if len(rest) != 2 {
		fmt.Fprintln(c.env.Stderr, usageLine)
		return "", 0, exitUsage
	}
	pid, err := strconv.Atoi(rest[1])
	if err != nil || pid <= 0 {
		fmt.Fprintf(c.env.Stderr, "corral: invalid process ID %q\n", rest[1])
		return "", 0, exitUsage
	}
	return rest[0], pid, -1
}

// ps lists a sandbox's processes: `corral ps [--json] ID`.
func (c *cli) ps(args []string) int {
	fs := c.flags("ps")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral ps [--json] ID")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	list, err := client.Processes(context.Background(), fs.Arg(0))
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		return c.printJSON(list)
	}
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tSTATUS\tAGE\tTTY\tTAG\tCOMMAND")
	now := time.Now()
	for _, p := range list {
		tty := "-"
		if p.PTY {
			tty = "pty"
		}
		tag := p.Tag
		if tag == "" {
			tag = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", p.PID, processStatus(p), now.Sub(p.StartedAt).Round(time.Second),
			tty, tag, strings.Join(p.Cmd, " "))
	}
	tw.Flush()
	return 0
}

// processStatus says in a word or two how a process is doing.
func processStatus(p corral.Process) string {
	switch {
	case p.Running:
		return "running"
	case p.TimedOut:
		return "timed out"
	case p.Signal != "":
		return "killed (" + p.Signal + ")"
	case p.ExitCode != nil:
		return fmt.Sprintf("exited (%d)", *p.ExitCode)
	}
	return "exited"
}

// logs prints a process's output: `corral logs [-f] [--from N] ID PID`.
func (c *cli) logs(args []string) int {
	fs := c.flags("logs")
	follow := fs.Bool("f", false, "keep printing new output until the process exits")
	from := fs.Int64("from", 0, "start at this byte offset of the output (0: all that is buffered)")
	id, pid, code := c.idAndPID(fs, args, "usage: corral logs [-f] [--from N] ID PID")
	if code >= 0 {
		return code
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	res, err := client.Output(ctx, id, pid, corral.OutputOptions{From: *from, Follow: *follow, Stdout: c.env.Stdout, Stderr: c.env.Stderr})
	if err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return c.fail(err)
	}
	if res.Dropped > 0 {
		fmt.Fprintf(c.env.Stderr, "corral: %d bytes of earlier output were no longer buffered\n", res.Dropped)
	}
	return 0
}

// kill signals a process: `corral kill [-s SIG] ID PID`.
func (c *cli) kill(args []string) int {
	fs := c.flags("kill")
	sig := fs.String("s", "SIGKILL", "signal to send: a name (TERM, SIGINT) or a number")
	id, pid, code := c.idAndPID(fs, args, "usage: corral kill [-s SIGNAL] ID PID")
	if code >= 0 {
		return code
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	if err := client.Signal(context.Background(), id, pid, *sig); err != nil {
		return c.fail(err)
	}
	return 0
}

// execDetached starts a background process for `corral exec -d` and
// prints its pid.
func (c *cli) execDetached(ctx context.Context, client *corral.Client, id string, eopts corral.ExecOptions, tag string) int {
	p, err := client.StartProcess(ctx, id, corral.StartOptions{Cmd: eopts.Cmd, Env: eopts.Env, Cwd: eopts.Cwd,
		User: eopts.User, Stdin: eopts.Stdin, Timeout: eopts.Timeout, Tag: tag})
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, p.PID)
	return 0
}
