package cli

import (
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// timerFlags are the lifecycle timer flags of create, run and update.
type timerFlags struct {
	idle, onIdle, onDeadline string
}

func (f *timerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.idle, "idle-timeout", "", "act after this long without exec, file or terminal activity, e.g. 10m (0: never)")
	fs.StringVar(&f.onIdle, "on-idle", "", "what the idle timeout does: destroy (default), pause or stop")
	fs.StringVar(&f.onDeadline, "on-deadline", "", "what the deadline does: destroy (default), pause or stop")
}

// apply sets the actions and returns the idle timeout, nil when not given.
func (f *timerFlags) apply(onDeadline, onIdle *string) (*time.Duration, error) {
	*onDeadline, *onIdle = f.onDeadline, f.onIdle
	if f.idle == "" {
		return nil, nil
	}
	d, err := parseDuration(f.idle)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// pool manages warm pools.
func (c *cli) pool(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral pool set NAME --template T [--runtime R] [--cpus N] [--memory M] [--pids N] [--disk D] [--network MODE] --size N | ls | rm NAME...")
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
	case "set":
		fs := c.flags("pool set")
		var opts corral.PoolOptions
		var memory, disk string
		fs.StringVar(&opts.Template, "template", "default", "template of the pool's sandboxes")
		fs.StringVar(&opts.Runtime, "runtime", "", "isolation runtime (default: the daemon's)")
		fs.Float64Var(&opts.CPUs, "cpus", 0, "CPU limit in cores (default: the daemon's)")
		fs.StringVar(&memory, "memory", "", "memory limit, e.g. 512M (default: the daemon's)")
		fs.StringVar(&disk, "disk", "", "disk limit, e.g. 1G (btrfs storage only)")
		fs.Int64Var(&opts.Pids, "pids", 0, "maximum number of processes and threads")
		fs.StringVar(&opts.Network, "network", "", "network mode the sandboxes wait in: none, allowlist or open (default: the daemon's)")
		fs.IntVar(&opts.Size, "size", 1, "how many sandboxes to keep ready")
		name, err := parseNameFirst(fs, rest)
		if err != nil {
			fmt.Fprintln(c.env.Stderr, "usage: corral pool set NAME --template T [--runtime R] [--cpus N] [--memory M] [--pids N] [--disk D] [--network MODE] --size N")
			return exitUsage
		}
		if opts.MemoryMB, err = parseMB("memory", memory); err != nil {
			return c.fail(err)
		}
		if opts.DiskMB, err = parseMB("disk", disk); err != nil {
			return c.fail(err)
		}
		p, err := client.SetPool(ctx, name, opts)
		if err != nil {
			return c.fail(err)
		}
		c.printPools([]corral.Pool{*p})
		return 0
	case "ls":
		list, err := client.Pools(ctx)
		if err != nil {
			return c.fail(err)
		}
		c.printPools(list)
		return 0
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral pool rm NAME...")
			return exitUsage
		}
		return c.forEach(rest, func(name string) error { return client.DeletePool(ctx, name) })
	}
	fmt.Fprintf(c.env.Stderr, "corral pool: unknown subcommand %q (set, ls, rm)\n", sub)
	return exitUsage
}

func (c *cli) printPools(list []corral.Pool) {
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTEMPLATE\tRUNTIME\tCPUS\tMEMORY\tNETWORK\tSIZE\tREADY\tFILLING\tERROR")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%dM\t%s\t%d\t%d\t%d\t%s\n", p.Name, p.Template, p.Runtime, p.CPUs, p.MemoryMB, p.Network, p.Size, p.Ready, p.Filling, p.Error)
	}
	tw.Flush()
}
