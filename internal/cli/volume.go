package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	corral "github.com/corralrun/corral/sdk"
)

const volumeUsage = "usage: corral volume create NAME [--size 10G] [--label K=V]... | ls [--json] | inspect NAME | rm NAME..."

// volume manages named volumes.
func (c *cli) volume(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, volumeUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "create":
		return c.volumeCreate(rest)
	case "ls":
		fs := c.flags("volume ls")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(rest); err != nil || fs.NArg() > 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral volume ls [--json]")
			return exitUsage
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			list, err := client.Volumes(ctx)
			if err != nil {
				return c.fail(err)
			}
			if *asJSON {
				if list == nil {
					list = []corral.Volume{}
				}
				return c.printJSON(list)
			}
			c.printVolumes(list)
			return 0
		})
	case "inspect":
		if len(rest) != 1 {
			fmt.Fprintln(c.env.Stderr, "usage: corral volume inspect NAME")
			return exitUsage
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			v, err := client.Volume(ctx, rest[0])
			if err != nil {
				return c.fail(err)
			}
			return c.printJSON(v)
		})
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral volume rm NAME...")
			return exitUsage
		}
		return c.each(rest, func(ctx context.Context, client *corral.Client, name string) error {
			return client.DeleteVolume(ctx, name)
		})
	}
	fmt.Fprintf(c.env.Stderr, "corral volume: unknown subcommand %q (create, ls, inspect, rm)\n", sub)
	return exitUsage
}

func (c *cli) volumeCreate(args []string) int {
	fs := c.flags("volume create")
	var size string
	var labels multiFlag
	fs.StringVar(&size, "size", "", "limit on what the volume holds, e.g. 10G (btrfs storage only)")
	fs.Var(&labels, "label", "label KEY=VALUE (repeatable)")
	name, err := parseNameFirst(fs, args)
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "usage: corral volume create NAME [--size 10G] [--label K=V]...")
		return exitUsage
	}
	var opts corral.VolumeOptions
	mb, err := parseMB("size", size)
	if err != nil {
		return c.fail(err)
	}
	opts.SizeBytes = mb << 20
	if opts.Labels, err = labels.pairs("--label"); err != nil {
		return c.fail(err)
	}
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		v, err := client.CreateVolume(ctx, name, opts)
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.env.Stdout, v.Name)
		return 0
	})
}

func (c *cli) printVolumes(list []corral.Volume) {
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tCREATED\tIN USE BY")
	for _, v := range list {
		size := "-"
		if v.SizeBytes > 0 {
			size = fmt.Sprintf("%dM", v.SizeBytes>>20)
		}
		fmt.Fprintf(tw, "%s\t%s\t%dM\t%s\t%s\n", v.Name, size, (v.UsedBytes+(1<<20-1))>>20,
			v.CreatedAt.Local().Format("2006-01-02 15:04"), strings.Join(v.InUseBy, ","))
	}
	tw.Flush()
}
