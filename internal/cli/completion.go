package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralrun/corral/sdk"
)

// completer returns what shell completion offers for the argument that
// follows args and starts with toComplete.
type completer func(c *cli, args []string, toComplete string) ([]string, cobra.ShellCompDirective)

var completionShells = []string{"bash", "zsh", "fish"}

// newRoot builds the cobra command tree from the command table. Each
// command parses its own flags (DisableFlagParsing), so that cobra only
// dispatches, completes and prints scripts, and every command keeps the
// flag syntax and the usage errors of the standard flag package.
func (c *cli) newRoot(table []command, code *int) *cobra.Command {
	root := &cobra.Command{
		Use:               "corral",
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetIn(c.env.Stdin)
	root.SetOut(c.env.Stdout)
	root.SetErr(c.env.Stderr)
	root.SetHelpFunc(func(*cobra.Command, []string) { writeUsage(c.env.Stdout) })
	root.SetHelpCommand(&cobra.Command{
		Use: "help", Hidden: true, DisableFlagParsing: true,
		Run:               func(*cobra.Command, []string) { writeUsage(c.env.Stdout) },
		ValidArgsFunction: cobra.NoFileCompletions,
	})
	for _, cmd := range table {
		cc := &cobra.Command{
			Use:                cmd.name,
			Hidden:             cmd.group == "",
			DisableFlagParsing: true,
			Args:               cobra.ArbitraryArgs,
			RunE: func(_ *cobra.Command, args []string) error {
				*code = cmd.run(c, args)
				return nil
			},
		}
		if len(cmd.usage) > 0 {
			cc.Short, _, _ = strings.Cut(cmd.usage[0].text, "\n")
		}
		complete := cmd.complete
		cc.ValidArgsFunction = func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if complete == nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return complete(c, args, toComplete)
		}
		root.AddCommand(cc)
	}
	return root
}

// completion runs `corral completion bash|zsh|fish`.
func (c *cli) completion(args []string) int {
	if len(args) != 1 || !slices.Contains(completionShells, args[0]) {
		fmt.Fprintln(c.env.Stderr, "usage: corral completion bash|zsh|fish")
		return exitUsage
	}
	var err error
	switch args[0] {
	case "bash":
		err = c.root.GenBashCompletionV2(c.env.Stdout, true)
	case "zsh":
		err = c.root.GenZshCompletion(c.env.Stdout)
	case "fish":
		err = c.root.GenFishCompletion(c.env.Stdout, true)
	}
	if err != nil {
		return c.fail(err)
	}
	return 0
}

// noArgs offers nothing, not even file names.
func noArgs(*cli, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// files leaves the arguments to the shell's file name completion.
func files(*cli, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveDefault
}

// subcommands offers names as the first argument.
func subcommands(names ...string) completer {
	return func(_ *cli, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// templateArgs offers template's subcommands, then file names to the ones
// that read files (import, build).
func templateArgs(c *cli, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 && (args[0] == "import" || args[0] == "build") {
		return files(c, args, toComplete)
	}
	return subcommands("ls", "inspect", "pull", "import", "build", "service", "capture", "rm")(c, args, toComplete)
}

// firstSandbox offers sandbox IDs as the first argument.
func firstSandbox(c *cli, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return sandboxes(c, args, toComplete)
}

// completionTimeout bounds the daemon lookup of a completion, so that an
// unreachable daemon never hangs the shell.
const completionTimeout = 2 * time.Second

// sandboxes offers the IDs of the daemon's sandboxes; with no daemon to
// ask it offers none.
func sandboxes(c *cli, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	client, err := c.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	list, err := client.List(ctx, corral.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var ids []string
	for _, sb := range list {
		if strings.HasPrefix(sb.ID, toComplete) {
			ids = append(ids, sb.ID)
		}
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}
