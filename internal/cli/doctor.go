package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/corralrun/corral/internal/doctor"
)

// doctor runs `corral doctor [--json]`: which runtimes and storage
// backends work on this host and, for each check that failed, what to do.
// It inspects the machine it runs on, not the daemon's (they are the same
// on a single host), and needs no daemon. Exit code 1 when no runtime is
// usable.
func (c *cli) doctor(args []string) int {
	fs := c.flags("doctor")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return exitUsage
	}
	r := doctor.Run(context.Background(), doctor.RealHost())
	code := 1
	for _, rt := range r.Runtimes {
		if rt.Available {
			code = 0
		}
	}
	if *asJSON {
		if c.printJSON(r) != 0 {
			return exitCLI
		}
		return code
	}
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tOK\tDETAIL")
	for _, ch := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", ch.Name, yesNo(ch.OK), ch.Detail)
		if !ch.OK && ch.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", ch.Fix)
		}
	}
	tw.Flush()
	for _, section := range []struct {
		title string
		rows  []doctor.Runtime
	}{{"RUNTIME", r.Runtimes}, {"STORAGE", r.Storage}} {
		fmt.Fprintln(c.env.Stdout)
		fmt.Fprintf(tw, "%s\tAVAILABLE\tNEEDS\n", section.title)
		for _, rt := range section.rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", rt.Name, yesNo(rt.Available), strings.Join(rt.Needs, ", "))
			if rt.Note != "" {
				fmt.Fprintf(tw, "\t\tnote: %s\n", rt.Note)
			}
		}
		tw.Flush()
	}
	return code
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
