package cli

import (
	"context"
	"fmt"

	corral "github.com/corralrun/corral/sdk"
)

// templateCapture is `corral template capture NAME [--runtime R] [--drop]`:
// make (or replace) the template's ready snapshot on a runtime, or remove
// it with --drop.
func (c *cli) templateCapture(ctx context.Context, client *corral.Client, args []string) int {
	fs := c.flags("template capture")
	runtime := fs.String("runtime", "", "runtime to capture on; it must save memory, as gvisor does (default: the daemon's)")
	drop := fs.Bool("drop", false, "remove the ready snapshot instead; sandboxes start cold again")
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral template capture NAME [--runtime R] [--drop]")
		return exitUsage
	}
	var t *corral.Template
	if *drop {
		t, err = client.DropReady(ctx, pos[0], *runtime)
	} else {
		t, err = client.CaptureReady(ctx, pos[0], *runtime)
	}
	if err != nil {
		return c.fail(err)
	}
	if *drop {
		fmt.Fprintln(c.env.Stdout, t.Name)
		return 0
	}
	for rt, snap := range t.ReadySnapshots {
		if *runtime == "" || rt == *runtime {
			fmt.Fprintf(c.env.Stdout, "%s: ready on %s (%s)\n", t.Name, rt, snap)
		}
	}
	return 0
}
