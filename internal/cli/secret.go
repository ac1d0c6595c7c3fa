package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"golang.org/x/term"

	corral "github.com/corralrun/corral/sdk"
)

const secretUsage = "usage: corral secret create NAME | rotate NAME (the value on standard input) | ls [--json] | rm NAME..."

// maxSecretValue is the daemon's limit on a value; reading one byte more
// tells a value that is too long from one that fits.
const maxSecretValue = 64 << 10

// secret manages the secrets of the caller's tenant. A value is read from
// standard input only, never from an argument or a flag, which other
// users see in the process list and shells keep in their history.
func (c *cli) secret(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(c.env.Stderr, secretUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "create", "rotate":
		if len(rest) != 1 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprintf(c.env.Stderr, "usage: corral secret %s NAME < FILE (or type the value; it is not echoed)\n", sub)
			return exitUsage
		}
		name := rest[0]
		value, err := c.readSecret(name)
		if err != nil {
			return c.fail(err)
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			var err error
			if sub == "create" {
				_, err = client.CreateSecret(ctx, name, value)
			} else {
				_, err = client.RotateSecret(ctx, name, value)
			}
			if err != nil {
				return c.fail(err)
			}
			fmt.Fprintln(c.env.Stdout, name)
			return 0
		})
	case "ls":
		fs := c.flags("secret ls")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(rest); err != nil || fs.NArg() > 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral secret ls [--json]")
			return exitUsage
		}
		return c.withClient(func(ctx context.Context, client *corral.Client) int {
			list, err := client.Secrets(ctx)
			if err != nil {
				return c.fail(err)
			}
			if *asJSON {
				if list == nil {
					list = []corral.Secret{}
				}
				return c.printJSON(list)
			}
			tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCREATED\tUPDATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.CreatedAt.Local().Format("2006-01-02 15:04"), s.UpdatedAt.Local().Format("2006-01-02 15:04"))
			}
			tw.Flush()
			return 0
		})
	case "rm":
		if len(rest) == 0 {
			fmt.Fprintln(c.env.Stderr, "usage: corral secret rm NAME...")
			return exitUsage
		}
		return c.each(rest, func(ctx context.Context, client *corral.Client, name string) error {
			return client.DeleteSecret(ctx, name)
		})
	}
	fmt.Fprintf(c.env.Stderr, "corral secret: unknown subcommand %q (create, rotate, ls, rm)\n", sub)
	return exitUsage
}

// readSecret reads a value from standard input without echoing it on a
// terminal. One trailing newline ("\n" or "\r\n") is dropped, as echo
// and editors add it; an empty value is refused.
func (c *cli) readSecret(name string) (string, error) {
	var b []byte
	var err error
	if tty := terminalOf(c.env.Stdin); tty != nil {
		fmt.Fprintf(c.env.Stderr, "value of secret %s (not echoed): ", name)
		b, err = term.ReadPassword(int(tty.Fd()))
		fmt.Fprintln(c.env.Stderr)
	} else {
		b, err = io.ReadAll(io.LimitReader(c.env.Stdin, maxSecretValue+3))
	}
	if err != nil {
		return "", fmt.Errorf("reading the value of secret %s from standard input: %w", name, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	switch {
	case v == "":
		return "", errors.New("the value is empty: give it on standard input, e.g. corral secret create NAME < FILE")
	case len(v) > maxSecretValue:
		return "", fmt.Errorf("the value is longer than %d bytes", maxSecretValue)
	}
	return v, nil
}
