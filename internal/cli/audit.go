package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralrun/corral/sdk"
)

const auditUsage = "usage: corral audit [--sandbox ID] [--key NAME] [--since T] [--follow] [--json]"

// audit prints the daemon's audit log: `corral audit [--sandbox ID]
// [--key NAME] [--since T] [--follow] [--json]`.
func (c *cli) audit(args []string) int {
	fs := c.flags("audit")
	id := fs.String("sandbox", "", "only records of this sandbox")
	key := fs.String("key", "", "only records of calls made with this API key (its name)")
	since := fs.String("since", "", "only records from `T` on: a time (RFC 3339, e.g. 2026-01-02T15:04:05Z) or a duration ago (10m, 2h)")
	follow := fs.Bool("follow", false, "keep printing records as they are written")
	asJSON := fs.Bool("json", false, "print each record as a JSON line")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(c.env.Stderr, auditUsage)
		return exitUsage
	}
	opts := corral.AuditOptions{SandboxID: *id, Key: *key, Follow: *follow}
	if *since != "" {
		t, err := parseSince(*since, time.Now())
		if err != nil {
			fmt.Fprintf(c.env.Stderr, "corral: %v\n", err)
			return exitUsage
		}
		opts.Since = t
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	enc := json.NewEncoder(c.env.Stdout)
	err = client.Audit(ctx, opts, func(r corral.AuditRecord) error {
		if *asJSON {
			return enc.Encode(r)
		}
		_, err := fmt.Fprintln(c.env.Stdout, formatAudit(r, time.Local))
		return err
	})
	if err != nil {
		if *follow && ctx.Err() != nil {
			return 0 // interrupted: the normal way to stop following
		}
		return c.fail(err)
	}
	return 0
}

// parseSince reads --since: an RFC 3339 time, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid --since %q: use a time like 2026-01-02T15:04:05Z or a duration ago like 10m or 2h", s)
	}
	return now.Add(-d), nil
}

// formatAudit is the readable line of a record: time, key, action,
// sandbox, then what ran and how it ended, and how long it took.
func formatAudit(r corral.AuditRecord, loc *time.Location) string {
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fields := []string{r.Time.In(loc).Format("2006-01-02T15:04:05.000Z07:00"), orDash(r.Key), r.Action, orDash(r.SandboxID)}
	if len(r.Argv) > 0 {
		fields = append(fields, shellJoin(r.Argv))
	}
	if r.CodeSHA256 != "" {
		fields = append(fields, "code sha256:"+r.CodeSHA256[:min(12, len(r.CodeSHA256))])
	}
	if r.Status != 0 {
		fields = append(fields, strconv.Itoa(r.Status))
	}
	if r.ExitCode != nil {
		fields = append(fields, "exit "+strconv.Itoa(*r.ExitCode))
	}
	if r.Signal != "" {
		fields = append(fields, "signal "+r.Signal)
	}
	if r.DurationMS > 0 {
		d := time.Duration(r.DurationMS * float64(time.Millisecond))
		if d >= time.Millisecond {
			d = d.Round(time.Millisecond)
		}
		fields = append(fields, d.String())
	}
	if r.Error != "" {
		fields = append(fields, "error: "+r.Error)
	}
	return strings.Join(fields, "  ")
}

// shellJoin writes argv as a shell would take it back: words that need
// it in single quotes.
func shellJoin(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		plain := a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
		})
		if plain {
			words[i] = a
		} else {
			words[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(words, " ")
}

// auditArgs offers sandbox IDs after --sandbox, and nothing else.
func auditArgs(c *cli, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if n := len(args); n > 0 && slices.Contains([]string{"--sandbox", "-sandbox"}, args[n-1]) {
		return sandboxes(c, args, toComplete)
	}
	return noArgs(c, args, toComplete)
}
