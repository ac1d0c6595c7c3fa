package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// pause freezes sandboxes.
func (c *cli) pause(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral pause ID...")
		return exitUsage
	}
	return c.each(args, func(ctx context.Context, client *corral.Client, id string) error {
		_, err := client.Pause(ctx, id)
		return err
	})
}

// each calls fn for every ID, printing each ID that succeeded; the exit
// code is that of the last failure.
func (c *cli) each(ids []string, fn func(context.Context, *corral.Client, string) error) int {
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		return c.forEach(ids, func(id string) error {
			if err := fn(ctx, client, id); err != nil {
				return err
			}
			fmt.Fprintln(c.env.Stdout, id)
			return nil
		})
	})
}

// forEach calls fn for every name, reporting each failure; the exit code
// is that of the last failure.
func (c *cli) forEach(names []string, fn func(string) error) int {
	code := 0
	for _, name := range names {
		if err := fn(name); err != nil {
			code = c.fail(err)
		}
	}
	return code
}

// withClient calls fn with a client and a context canceled by signals.
func (c *cli) withClient(fn func(context.Context, *corral.Client) int) int {
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	return fn(ctx, client)
}

// resume thaws a sandbox and sets its deadline.
func (c *cli) resume(args []string) int {
	fs := c.flags("resume")
	timeout := fs.String("timeout", "", "new lifetime from now, e.g. 10m; 0 for no deadline (default: the daemon's)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral resume [--timeout D] ID")
		return exitUsage
	}
	var d *time.Duration
	if *timeout != "" {
		v, err := parseDuration(*timeout)
		if err != nil {
			return c.fail(err)
		}
		d = &v
	}
	var sb *corral.Sandbox
	code := c.each(fs.Args(), func(ctx context.Context, client *corral.Client, id string) (err error) {
		sb, err = client.Resume(ctx, id, d)
		return err
	})
	if code == 0 && sb.Deadline != nil {
		fmt.Fprintf(c.env.Stderr, "deadline %s\n", sb.Deadline.Local().Format(time.RFC3339))
	}
	return code
}

// fork copies a sandbox and prints the copies' IDs.
func (c *cli) fork(args []string) int {
	fs := c.flags("fork")
	count := fs.Int("count", 1, "number of copies")
	volumes := fs.String("volumes", "", "what the copies get of the sandbox's volumes: share (the same ones) or copy (a copy each)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral fork [--count N] [--volumes share|copy] ID")
		return exitUsage
	}
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		copies, err := client.ForkWith(ctx, fs.Arg(0), corral.ForkOptions{Count: *count, Volumes: *volumes})
		if err != nil {
			return c.fail(err)
		}
		for _, sb := range copies {
			fmt.Fprintln(c.env.Stdout, sb.ID)
		}
		return 0
	})
}

const snapshotUsage = "usage: corral snapshot create [--metadata K=V]... [--volumes share|copy] ID NAME | ls | rm NAME... | template SNAPSHOT TEMPLATE"

// snapshot manages snapshots.
func (c *cli) snapshot(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, snapshotUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "create":
		return c.snapshotCreate(rest)
	case "ls":
		return c.snapshotList()
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral snapshot rm NAME...")
			return exitUsage
		}
		return c.each(rest, func(ctx context.Context, client *corral.Client, name string) error {
			return client.DeleteSnapshot(ctx, name)
		})
	case "template":
		if len(rest) != 2 {
			fmt.Fprintln(c.env.Stderr, "usage: corral snapshot template SNAPSHOT TEMPLATE")
			return exitUsage
		}
		return c.each(rest[1:], func(ctx context.Context, client *corral.Client, name string) error {
			_, err := client.TemplateFromSnapshot(ctx, name, rest[0])
			return err
		})
	}
	fmt.Fprintf(c.env.Stderr, "corral snapshot: unknown subcommand %q\n%s\n", sub, snapshotUsage)
	return exitUsage
}

func (c *cli) snapshotCreate(args []string) int {
	fs := c.flags("snapshot create")
	var meta multiFlag
	fs.Var(&meta, "metadata", "metadata KEY=VALUE (repeatable)")
	volumes := fs.String("volumes", "", "what the snapshot keeps of the sandbox's volumes: share (the same ones) or copy (a copy)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(c.env.Stderr, "usage: corral snapshot create [--metadata K=V]... [--volumes share|copy] ID NAME")
		return exitUsage
	}
	m, err := meta.pairs("--metadata")
	if err != nil {
		return c.fail(err)
	}
	var snap *corral.Snapshot
	code := c.each(fs.Args()[1:], func(ctx context.Context, client *corral.Client, name string) (err error) {
		snap, err = client.CreateSnapshotWith(ctx, fs.Arg(0), corral.SnapshotOptions{Name: name, Metadata: m, Volumes: *volumes})
		return err
	})
	if code == 0 {
		fmt.Fprintf(c.env.Stderr, "%s snapshot of %s, %d bytes\n", snap.Kind, snap.SandboxID, snap.SizeBytes)
	}
	return code
}

func (c *cli) snapshotList() int {
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		list, err := client.Snapshots(ctx)
		if err != nil {
			return c.fail(err)
		}
		tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tRUNTIME\tTEMPLATE\tSANDBOX\tSIZE\tCREATED")
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, s.Runtime, s.Template, s.SandboxID,
				humanBytes(s.SizeBytes), s.CreatedAt.Local().Format(time.DateTime))
		}
		tw.Flush()
		return 0
	})
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
