package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

const nodeUsage = "usage: corral node ls [--json]"

// node shows the nodes of the cluster the daemon is in (admin keys and
// the unix socket only).
func (c *cli) node(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, nodeUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	if sub != "ls" {
		fmt.Fprintf(c.env.Stderr, "corral node: unknown subcommand %q (ls)\n", sub)
		return exitUsage
	}
	fs := c.flags("node ls")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(rest); err != nil || fs.NArg() > 0 {
		fmt.Fprintln(c.env.Stderr, nodeUsage)
		return exitUsage
	}
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		list, err := client.Nodes(ctx)
		if err != nil {
			return c.fail(err)
		}
		if *asJSON {
			if list == nil {
				list = []corral.Node{}
			}
			return c.printJSON(list)
		}
		c.printNodes(list, time.Now())
		return 0
	})
}

// printNodes shows each node's capacity next to what its sandboxes
// reserve of it, and how long ago it wrote its record.
func (c *cli) printNodes(list []corral.Node, now time.Time) {
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADVERTISE\tRUNTIMES\tTEMPLATES\tSANDBOXES\tRUNNING\tCPUS\tMEMORY\tUPDATED")
	for _, n := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%g/%g\t%s/%s\t%s ago\n", n.Name, n.Advertise, strings.Join(n.Runtimes, ","),
			len(n.Templates), n.Load.Sandboxes, n.Load.Running,
			float64(n.Load.ReservedMilliCPUs)/1000, float64(n.Capacity.MilliCPUs)/1000,
			humanBytes(n.Load.ReservedMemoryBytes), humanBytes(n.Capacity.MemoryBytes),
			max(now.Sub(n.UpdatedAt), 0).Round(time.Second))
	}
	tw.Flush()
}
