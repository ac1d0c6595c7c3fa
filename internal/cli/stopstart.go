package cli

import (
	"context"
	"fmt"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// stop stops sandboxes: their processes end, their files stay.
func (c *cli) stop(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral stop ID...")
		return exitUsage
	}
	return c.each(args, func(ctx context.Context, client *corral.Client, id string) error {
		_, err := client.Stop(ctx, id)
		return err
	})
}

// start boots stopped sandboxes again.
func (c *cli) start(args []string) int {
	fs := c.flags("start")
	timeout := fs.String("timeout", "", "new lifetime from now, e.g. 10m; 0 for no deadline (default: the daemon's)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral start [--timeout D] ID...")
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
	return c.each(fs.Args(), func(ctx context.Context, client *corral.Client, id string) error {
		_, err := client.Start(ctx, id, d)
		return err
	})
}
