package cli

import (
	"context"
	"fmt"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// update changes the limits of a running sandbox.
func (c *cli) update(args []string) int {
	fs := c.flags("update")
	cpus := fs.Float64("cpus", 0, "new CPU limit in cores")
	memory := fs.String("memory", "", "new memory limit, e.g. 1G")
	pids := fs.Int64("pids", 0, "new maximum number of processes and threads")
	var timers timerFlags
	timers.register(fs)
	id, err := parseNameFirst(fs, args)
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "usage: corral update ID [--cpus N] [--memory M] [--pids N] [--idle-timeout D] [--on-idle A] [--on-deadline A]")
		return exitUsage
	}
	mb, err := parseMB("memory", *memory)
	if err != nil {
		return c.fail(err)
	}
	opts := corral.UpdateOptions{CPUs: *cpus, MemoryMB: mb, Pids: *pids}
	if opts.IdleTimeout, err = timers.apply(&opts.OnDeadline, &opts.OnIdle); err != nil {
		return c.fail(err)
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	sb, err := client.Update(context.Background(), id, opts)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.env.Stdout, "%s: cpus %g, memory %dM, pids %d, idle timeout %s (on idle: %s), on deadline: %s\n",
		sb.ID, sb.CPUs, sb.MemoryMB, sb.Pids, time.Duration(sb.IdleTimeout)*time.Second, sb.OnIdle, sb.OnDeadline)
	return 0
}
