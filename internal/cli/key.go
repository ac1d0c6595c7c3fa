package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	corral "github.com/corralrun/corral/sdk"
)

const keyUsage = "usage: corral key create NAME [--tenant T] [--admin] [--max-sandboxes N] [--max-memory SIZE] [--max-cpus N] [--max-disk SIZE] [--creates-per-minute N] | ls [--json] | rm NAME... | rotate NAME"

// key manages API keys (admin keys and the unix socket only).
func (c *cli) key(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, keyUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "create":
		return c.keyCreate(rest)
	case "ls":
		fs := c.flags("key ls")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(rest); err != nil || fs.NArg() > 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral key ls [--json]")
			return exitUsage
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			list, err := client.Keys(ctx)
			if err != nil {
				return c.fail(err)
			}
			if *asJSON {
				if list == nil {
					list = []corral.Key{}
				}
				return c.printJSON(list)
			}
			tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTENANT\tADMIN\tQUOTAS\tCREATED")
			for _, k := range list {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", k.Name, k.Tenant, k.Admin, quotas(k), k.CreatedAt.Local().Format("2006-01-02 15:04"))
			}
			tw.Flush()
			return 0
		})
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral key rm NAME...")
			return exitUsage
		}
		return c.each(rest, func(ctx context.Context, client *corral.Client, name string) error {
			return client.DeleteKey(ctx, name)
		})
	case "rotate":
		if len(rest) != 1 {
			fmt.Fprintln(c.env.Stderr, "usage: corral key rotate NAME")
			return exitUsage
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			k, err := client.RotateKey(ctx, rest[0])
			if err != nil {
				return c.fail(err)
			}
			return c.printSecret(k)
		})
	}
	fmt.Fprintf(c.env.Stderr, "corral key: unknown subcommand %q (create, ls, rm, rotate)\n", sub)
	return exitUsage
}

func (c *cli) keyCreate(args []string) int {
	fs := c.flags("key create")
	var o corral.KeyOptions
	var memory, disk string
	fs.StringVar(&o.Tenant, "tenant", "", "tenant the key acts for (default: the key's name)")
	fs.BoolVar(&o.Admin, "admin", false, "an admin key: sees and acts on every tenant's objects")
	fs.IntVar(&o.MaxSandboxes, "max-sandboxes", 0, "most sandboxes the tenant may hold (0: no quota)")
	fs.StringVar(&memory, "max-memory", "", "most memory its sandboxes' limits may add up to, e.g. 8G")
	fs.Float64Var(&o.MaxCPUs, "max-cpus", 0, "most CPU cores its sandboxes' limits may add up to")
	fs.StringVar(&disk, "max-disk", "", "most disk its sandboxes' limits may add up to, e.g. 100G")
	fs.IntVar(&o.CreatesPerMinute, "creates-per-minute", 0, "most creates it may start in a minute")
	name, err := parseNameFirst(fs, args)
	if err == nil {
		o.Name = name
		if o.MaxMemoryMB, err = parseMB("max-memory", memory); err == nil {
			o.MaxDiskMB, err = parseMB("max-disk", disk)
		}
	}
	if err != nil {
		fmt.Fprintln(c.env.Stderr, err)
		fmt.Fprintln(c.env.Stderr, keyUsage)
		return exitUsage
	}
	return c.withClient(func(ctx context.Context, client *corral.Client) int {
		k, err := client.CreateKey(ctx, o)
		if err != nil {
			return c.fail(err)
		}
		return c.printSecret(k)
	})
}

// printSecret prints a new key's secret on stdout, alone (for scripts),
// and what to do with it on stderr.
func (c *cli) printSecret(k *corral.Key) int {
	fmt.Fprintln(c.env.Stdout, k.Key)
	fmt.Fprintf(c.env.Stderr, "key %s (tenant %s): this is the only time it is shown; clients send it as CORRAL_API_KEY\n", k.Name, k.Tenant)
	return 0
}

// quotas describes a key's quotas for a listing.
func quotas(k corral.Key) string {
	s := ""
	add := func(v string) {
		if s != "" {
			s += ","
		}
		s += v
	}
	if k.MaxSandboxes > 0 {
		add(fmt.Sprintf("sandboxes=%d", k.MaxSandboxes))
	}
	if k.MaxMemoryMB > 0 {
		add(fmt.Sprintf("memory=%dM", k.MaxMemoryMB))
	}
	if k.MaxCPUs > 0 {
		add(fmt.Sprintf("cpus=%g", k.MaxCPUs))
	}
	if k.MaxDiskMB > 0 {
		add(fmt.Sprintf("disk=%dM", k.MaxDiskMB))
	}
	if k.CreatesPerMinute > 0 {
		add(fmt.Sprintf("creates/min=%d", k.CreatesPerMinute))
	}
	if s == "" {
		return "-"
	}
	return s
}
