package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// execFlags are the flags shared by run and exec.
type execFlags struct {
	env         multiFlag
	user, cwd   string
	timeout     string
	interactive bool
}

func (f *execFlags) register(fs *flag.FlagSet, envFlag bool) {
	if envFlag {
		fs.Var(&f.env, "e", "environment variable KEY=VALUE (repeatable)")
	}
	fs.StringVar(&f.user, "user", "", "user to run as: name or uid[:gid] (default: the template's user, else root)")
	fs.StringVar(&f.cwd, "cwd", "", "working directory (default: the template's working directory, else the user's home)")
	fs.StringVar(&f.timeout, "exec-timeout", "", "kill the command after this long, e.g. 30s")
	fs.BoolVar(&f.interactive, "i", false, "pass standard input to the command")
}

func (c *cli) execOptions(f *execFlags, cmd []string) (corral.ExecOptions, error) {
	opts := corral.ExecOptions{Cmd: cmd, User: f.user, Cwd: f.cwd, Stdout: c.env.Stdout, Stderr: c.env.Stderr}
	var err error
	if opts.Env, err = f.env.pairs("-e"); err != nil {
		return opts, err
	}
	if f.timeout != "" {
		if opts.Timeout, err = parseDuration(f.timeout); err != nil {
			return opts, err
		}
	}
	if f.interactive {
		in, err := io.ReadAll(c.env.Stdin)
		if err != nil {
			return opts, fmt.Errorf("reading standard input: %w", err)
		}
		opts.Stdin = in
		if opts.Stdin == nil {
			opts.Stdin = []byte{}
		}
	}
	return opts, nil
}

// runResult turns an exec result into the CLI's exit code, saying why a
// process died when the reason is not its own.
func (c *cli) runResult(res *corral.ExecResult) int {
	switch {
	case res.OOMKilled:
		fmt.Fprintln(c.env.Stderr, "corral: process killed: out of memory (sandbox memory limit reached)")
	case res.TimedOut:
		fmt.Fprintln(c.env.Stderr, "corral: process killed: exec timeout reached")
	}
	if res.OutputTruncated {
		fmt.Fprintf(c.env.Stderr, "corral: output truncated: %d bytes discarded\n", res.OutputDiscarded)
	}
	return res.ExitCode
}

// splitCommand separates flags-and-ID from the command after "--" (the
// "--" is optional when the command does not start with a dash).
func splitCommand(args []string) (before, cmd []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

func (c *cli) run(args []string) int {
	fs := c.flags("run")
	var cf createFlags
	cf.register(fs)
	var ef execFlags
	ef.register(fs, false)
	keep := fs.Bool("keep", false, "keep the sandbox after the command ends and print its ID")
	before, cmd := splitCommand(args)
	if err := fs.Parse(before); err != nil {
		return exitUsage
	}
	if len(cmd) == 0 {
		cmd = fs.Args()
	} else if fs.NArg() > 0 {
		fmt.Fprintf(c.env.Stderr, "corral run: unexpected arguments before --: %v\n", fs.Args())
		return exitUsage
	}
	if len(cmd) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral run [flags] -- CMD [ARG...]")
		return exitUsage
	}
	opts, err := cf.options()
	if err != nil {
		return c.fail(err)
	}
	eopts, err := c.execOptions(&ef, cmd)
	if err != nil {
		return c.fail(err)
	}
	// The sandbox's env applies to every exec; -e on run is sandbox env.
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	// One round trip: the daemon creates the sandbox, runs the command
	// and, without --keep, deletes the sandbox, also when this client is
	// interrupted.
	ropts := corral.RunOptions{Sandbox: opts, Exec: eopts, Remove: !*keep}
	if *keep {
		ropts.Created = func(sb *corral.Sandbox) { fmt.Fprintln(c.env.Stderr, sb.ID) }
	}
	_, res, err := client.Run(ctx, ropts)
	switch {
	case err != nil && res != nil:
		// The command ran; deleting its sandbox failed.
		fmt.Fprintf(c.env.Stderr, "corral: %v\n", err)
	case err != nil:
		return c.fail(err)
	}
	return c.runResult(res)
}

func (c *cli) create(args []string) int {
	fs := c.flags("create")
	var cf createFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.env.Stderr, "corral create: unexpected arguments %v\n", fs.Args())
		return exitUsage
	}
	opts, err := cf.options()
	if err != nil {
		return c.fail(err)
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	sb, err := client.Create(ctx, opts)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, sb.ID)
	return 0
}

func (c *cli) exec(args []string) int {
	fs := c.flags("exec")
	var ef execFlags
	ef.register(fs, true)
	var detach bool
	fs.BoolVar(&detach, "d", false, "start the command in the background and print its PID (see ps, logs, attach, kill)")
	fs.BoolVar(&detach, "detach", false, "same as -d")
	tag := fs.String("tag", "", "label shown by ps (with -d)")
	before, cmd := splitCommand(args)
	if err := fs.Parse(before); err != nil {
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral exec [flags] ID -- CMD [ARG...]")
		return exitUsage
	}
	id := rest[0]
	if len(cmd) == 0 {
		cmd = rest[1:]
	} else if len(rest) > 1 {
		fmt.Fprintf(c.env.Stderr, "corral exec: unexpected arguments before --: %v\n", rest[1:])
		return exitUsage
	}
	if len(cmd) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral exec [flags] ID -- CMD [ARG...]")
		return exitUsage
	}
	eopts, err := c.execOptions(&ef, cmd)
	if err != nil {
		return c.fail(err)
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	if detach {
		return c.execDetached(ctx, client, id, eopts, *tag)
	}
	res, err := client.Exec(ctx, id, eopts)
	if err != nil {
		return c.fail(err)
	}
	return c.runResult(res)
}

func (c *cli) ls(args []string) int {
	fs := c.flags("ls")
	state := fs.String("state", "", "only sandboxes in this state (running, paused, error, ...)")
	quiet := fs.Bool("q", false, "print IDs only")
	asJSON := fs.Bool("json", false, "print JSON")
	var md multiFlag
	fs.Var(&md, "metadata", "only sandboxes with metadata KEY=VALUE (repeatable)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	filter, err := md.pairs("--metadata")
	if err != nil {
		return c.fail(err)
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	list, err := client.List(context.Background(), corral.ListOptions{State: *state, Metadata: filter})
	if err != nil {
		return c.fail(err)
	}
	switch {
	case *asJSON:
		return c.printJSON(list)
	case *quiet:
		for _, sb := range list {
			fmt.Fprintln(c.env.Stdout, sb.ID)
		}
		return 0
	}
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEMPLATE\tRUNTIME\tSTATE\tCPUS\tMEMORY\tAGE\tEXPIRES")
	now := time.Now()
	for _, sb := range list {
		expires := "never"
		if sb.Deadline != nil {
			expires = "in " + sb.Deadline.Sub(now).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%dM\t%s\t%s\n", sb.ID, sb.Template, sb.Runtime, sb.State,
			sb.CPUs, sb.MemoryMB, now.Sub(sb.CreatedAt).Round(time.Second), expires)
	}
	tw.Flush()
	return 0
}

func (c *cli) printJSON(v any) int {
	enc := json.NewEncoder(c.env.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return c.fail(err)
	}
	return 0
}

func (c *cli) rm(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral rm ID...")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	return c.forEach(args, func(id string) error {
		if err := client.Delete(context.Background(), id); err != nil {
			return err
		}
		fmt.Fprintln(c.env.Stdout, id)
		return nil
	})
}

func (c *cli) inspect(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral inspect ID")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	sb, err := client.Get(context.Background(), args[0])
	if err != nil {
		return c.fail(err)
	}
	return c.printJSON(sb)
}

func (c *cli) timeout(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(c.env.Stderr, "usage: corral timeout ID DURATION")
		return exitUsage
	}
	d, err := parseDuration(args[1])
	if err != nil {
		return c.fail(err)
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	sb, err := client.SetTimeout(context.Background(), args[0], d)
	if err != nil {
		return c.fail(err)
	}
	if sb.Deadline == nil {
		fmt.Fprintf(c.env.Stdout, "%s: no deadline\n", sb.ID)
	} else {
		fmt.Fprintf(c.env.Stdout, "%s: deadline %s\n", sb.ID, sb.Deadline.Local().Format(time.RFC3339))
	}
	return 0
}

func (c *cli) template(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral template ls | inspect NAME | service NAME ... | pull NAME REF | build NAME [--recipe R | -f Dockerfile [CONTEXT]] | import NAME FILE | rm NAME")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	sub, rest := args[0], args[1:]
	switch sub {
	case "ls":
		list, err := client.Templates(ctx)
		if err != nil {
			return c.fail(err)
		}
		tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSOURCE\tCREATED\tSERVICE")
		for _, t := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Source, t.CreatedAt.Local().Format(time.DateTime), serviceSummary(t.Service))
		}
		tw.Flush()
		return 0
	case "build":
		return c.templateBuild(ctx, client, rest)
	case "pull":
		return c.templatePull(ctx, client, rest)
	case "service":
		return c.templateService(ctx, client, rest)
	case "inspect":
		if len(rest) != 1 {
			fmt.Fprintln(c.env.Stderr, "usage: corral template inspect NAME")
			return exitUsage
		}
		t, err := client.Template(ctx, rest[0])
		if err != nil {
			return c.fail(err)
		}
		return c.printJSON(t)
	case "capture":
		return c.templateCapture(ctx, client, rest)
	case "import":
		if len(rest) != 2 {
			fmt.Fprintln(c.env.Stderr, "usage: corral template import NAME FILE.tar (a root file system, an OCI image layout or a docker save archive)")
			return exitUsage
		}
		f, err := os.Open(rest[1])
		if err != nil {
			return c.fail(err)
		}
		defer f.Close()
		t, err := client.ImportTemplate(ctx, rest[0], f)
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.env.Stdout, t.Name)
		return 0
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral template rm NAME...")
			return exitUsage
		}
		return c.forEach(rest, func(name string) error { return client.DeleteTemplate(ctx, name) })
	}
	fmt.Fprintf(c.env.Stderr, "corral template: unknown subcommand %q\n", sub)
	return exitUsage
}

// parseNameFirst parses "NAME [flags]" or "[flags] NAME".
func parseNameFirst(fs *flag.FlagSet, args []string) (string, error) {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 || name == "" {
		return "", fmt.Errorf("expected one NAME")
	}
	return name, nil
}
