package cli

import (
	"encoding/json"
	"fmt"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// events follows the daemon's lifecycle events until interrupted:
// `corral events [--sandbox ID] [--type T]... [--json]`.
func (c *cli) events(args []string) int {
	fs := c.flags("events")
	id := fs.String("sandbox", "", "only events of this sandbox")
	var types multiFlag
	fs.Var(&types, "type", "only events of this type (repeatable): created, running, paused, resumed, stopped, started, deleted, error, timeout, oom_killed")
	asJSON := fs.Bool("json", false, "print each event as a JSON line")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(c.env.Stderr, "usage: corral events [--sandbox ID] [--type T]... [--json]")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	stream, err := client.Events(ctx, corral.EventOptions{SandboxID: *id, Types: types})
	if err != nil {
		return c.fail(err)
	}
	defer stream.Close()
	enc := json.NewEncoder(c.env.Stdout)
	for ev, err := range stream.All() {
		if err != nil {
			if ctx.Err() != nil {
				return 0 // interrupted: the normal way to stop following
			}
			return c.fail(err)
		}
		if *asJSON {
			_ = enc.Encode(ev)
			continue
		}
		line := fmt.Sprintf("%s  %-8s %s  %s", ev.Time.Local().Format(time.RFC3339Nano), ev.Type, ev.SandboxID, ev.State)
		if ev.Error != nil {
			line += "  " + ev.Error.Message
		}
		fmt.Fprintln(c.env.Stdout, line)
	}
	if ctx.Err() != nil {
		return 0
	}
	return c.fail(fmt.Errorf("the daemon ended the event stream"))
}
