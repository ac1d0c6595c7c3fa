package cli

import (
	"fmt"
	"strings"

	"github.com/corralrun/corral/internal/bench"
)

// bench runs the standard benchmark scenarios against the daemon and
// prints a table, or JSON with --json.
func (c *cli) bench(args []string) int {
	fs := c.flags("bench")
	opts := bench.Options{}
	fs.StringVar(&opts.Runtime, "runtime", "", "isolation runtime, runc or gvisor (default: the daemon's)")
	fs.StringVar(&opts.Template, "template", "default", "template to start from")
	fs.IntVar(&opts.Iterations, "iterations", 50, "samples of the exec, cold-start and warm-claim scenarios (0 skips them)")
	fs.IntVar(&opts.Burst, "burst", 200, "concurrent creates of the burst scenario, each of which must succeed or get 503 with Retry-After (0 skips it)")
	fs.IntVar(&opts.Density, "density", 100, "idle sandboxes of the density scenario (0 skips it)")
	peers := fs.Bool("peers", false, "also run the cold start bare on runc, runsc, bwrap and podman where installed, and time runc exec and runsc exec against Corral's exec")
	fs.IntVar(&opts.DaemonPID, "daemon-pid", 0, "the daemon's pid, for its RSS (default: the unix socket's peer)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral bench [--runtime R] [--template T] [--iterations N] [--burst B] [--density D] [--peers] [--json]")
		return exitUsage
	}
	if *peers {
		opts.Peers = bench.AllPeers()
	}
	opts.Host = c.env.Getenv("CORRAL_HOST")
	opts.Command = strings.Join(append([]string{"corral", "bench"}, args...), " ")
	opts.Progress = c.env.Stderr
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	rep, runErr := bench.Run(ctx, opts, client)
	print := bench.PrintTable
	if *asJSON {
		print = bench.PrintJSON
	}
	if err := print(c.env.Stdout, rep); err != nil {
		return c.fail(err)
	}
	if runErr != nil {
		return c.fail(runErr)
	}
	return 0
}
