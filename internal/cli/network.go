package cli

import (
	"flag"
	"fmt"
	"io"

	corral "github.com/corralrun/corral/sdk"
)

// networkFlags are the network policy flags of create, run and network.
type networkFlags struct {
	mode           string
	domains, cidrs multiFlag
}

// register adds the flags; modeFlag names the mode flag ("network" on
// create and run, "mode" on the network command).
func (f *networkFlags) register(fs *flag.FlagSet, modeFlag string) {
	fs.StringVar(&f.mode, modeFlag, "", "network mode: none, allowlist or open (default: allowlist with --allow-domain or --allow-cidr, else the daemon's)")
	fs.Var(&f.domains, "allow-domain", "domain the sandbox may reach: NAME or NAME:PORT[,PORT...]; *.NAME for every name below NAME (repeatable)")
	fs.Var(&f.cidrs, "allow-cidr", "IPv4 destination the sandbox may reach directly: ADDRESS[/BITS] or ADDRESS[/BITS]:PORT[,PORT...] (repeatable)")
}

// set reports whether any of the flags was given.
func (f *networkFlags) set() bool { return f.mode != "" || len(f.domains)+len(f.cidrs) > 0 }

// policy is the policy the flags describe; nil when none was given.
func (f *networkFlags) policy() *corral.NetworkPolicy {
	if !f.set() {
		return nil
	}
	return &corral.NetworkPolicy{Mode: f.mode, AllowDomains: f.domains, AllowCIDRs: f.cidrs}
}

// network shows a sandbox's network policy or, with flags, replaces it
// live.
func (c *cli) network(args []string) int {
	fs := c.flags("network")
	var nf networkFlags
	nf.register(fs, "mode")
	id, err := parseNameFirst(fs, args)
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "usage: corral network ID [--mode none|allowlist|open] [--allow-domain D]... [--allow-cidr C]...")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	var sb *corral.Sandbox
	if nf.set() {
		// Header rules have no flags here: the sandbox's are sent back
		// without their values, which the daemon keeps.
		if sb, err = client.Get(ctx, id); err != nil {
			return c.fail(err)
		}
		p := nf.policy()
		if sb.Network != nil {
			for _, h := range sb.Network.Headers {
				p.Headers = append(p.Headers, corral.HeaderRule{Domain: h.Domain, Name: h.Name})
			}
		}
		sb, err = client.UpdateNetwork(ctx, id, *p)
	} else {
		sb, err = client.Get(ctx, id)
	}
	if err != nil {
		return c.fail(err)
	}
	printPolicy(c.env.Stdout, sb.Network)
	return 0
}

// printPolicy prints a policy one rule a line, in the flags' syntax.
func printPolicy(w io.Writer, p *corral.NetworkPolicy) {
	if p == nil {
		fmt.Fprintln(w, "mode: none (the runtime's own network: made before network policies)")
		return
	}
	fmt.Fprintf(w, "mode: %s\n", p.Mode)
	for _, d := range p.AllowDomains {
		fmt.Fprintf(w, "allow-domain: %s\n", d)
	}
	for _, cidr := range p.AllowCIDRs {
		fmt.Fprintf(w, "allow-cidr: %s\n", cidr)
	}
	for _, h := range p.Headers {
		fmt.Fprintf(w, "header: %s %s (value hidden)\n", h.Domain, h.Name)
	}
}
