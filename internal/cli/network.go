package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	corral "github.com/corralrun/corral/sdk"
)

// networkFlags are the network policy flags of create, run and network.
type networkFlags struct {
	mode                  string
	domains, cidrs        multiFlag
	headers, placeholders multiFlag
}

// register adds the flags; modeFlag names the mode flag ("network" on
// create and run, "mode" on the network command).
func (f *networkFlags) register(fs *flag.FlagSet, modeFlag string) {
	fs.StringVar(&f.mode, modeFlag, "", "network mode: none, allowlist or open (default: allowlist with --allow-domain or --allow-cidr, else the daemon's)")
	fs.Var(&f.domains, "allow-domain", "domain the sandbox may reach: NAME or NAME:PORT[,PORT...]; *.NAME for every name below NAME (repeatable)")
	fs.Var(&f.cidrs, "allow-cidr", "IPv4 destination the sandbox may reach directly: ADDRESS[/BITS] or ADDRESS[/BITS]:PORT[,PORT...] (repeatable)")
	fs.Var(&f.headers, "inject-header", "header the proxy sets on requests to a domain: `DOMAIN:HEADER=TEMPLATE`, where TEMPLATE names secrets\n"+
		"as {{secret:NAME}} (see corral secret) so that no value appears on the command line (repeatable)")
	fs.Var(&f.placeholders, "placeholder", "environment variable holding a stand-in the proxy swaps for a secret in requests to a domain:\n"+
		"`ENV=SECRET@DOMAIN[,body]`; with ,body in request bodies too (repeatable)")
}

// set reports whether any of the flags was given.
func (f *networkFlags) set() bool {
	return f.mode != "" || len(f.domains)+len(f.cidrs)+len(f.headers)+len(f.placeholders) > 0
}

// policy is the policy the flags describe; nil when none was given.
func (f *networkFlags) policy() (*corral.NetworkPolicy, error) {
	if !f.set() {
		return nil, nil
	}
	p := &corral.NetworkPolicy{Mode: f.mode, AllowDomains: f.domains, AllowCIDRs: f.cidrs}
	for _, s := range f.headers {
		h, err := parseHeaderFlag(s)
		if err != nil {
			return nil, err
		}
		p.Headers = append(p.Headers, h)
	}
	for _, s := range f.placeholders {
		r, err := parsePlaceholderFlag(s)
		if err != nil {
			return nil, err
		}
		p.Placeholders = append(p.Placeholders, r)
	}
	return p, nil
}

// parseHeaderFlag parses DOMAIN:HEADER=TEMPLATE. Neither a domain nor a
// header name holds ':' or '=', so the template may.
func parseHeaderFlag(s string) (corral.HeaderRule, error) {
	domain, rest, ok1 := strings.Cut(s, ":")
	name, value, ok2 := strings.Cut(rest, "=")
	if !ok1 || !ok2 || domain == "" || name == "" || value == "" {
		return corral.HeaderRule{}, fmt.Errorf("--inject-header %q: want DOMAIN:HEADER=TEMPLATE, e.g. api.example.com:Authorization=Bearer {{secret:NAME}}", s)
	}
	return corral.HeaderRule{Domain: domain, Name: name, Value: value}, nil
}

// parsePlaceholderFlag parses ENV=SECRET@DOMAIN[,body].
func parsePlaceholderFlag(s string) (corral.PlaceholderRule, error) {
	env, rest, ok1 := strings.Cut(s, "=")
	secret, domain, ok2 := strings.Cut(rest, "@")
	domain, opt, hasOpt := strings.Cut(domain, ",")
	if !ok1 || !ok2 || env == "" || secret == "" || domain == "" || (hasOpt && opt != "body") {
		return corral.PlaceholderRule{}, fmt.Errorf("--placeholder %q: want ENV=SECRET@DOMAIN[,body], e.g. OPENAI_API_KEY=openai@api.openai.com", s)
	}
	return corral.PlaceholderRule{Domain: domain, Env: env, Secret: secret, Body: hasOpt}, nil
}

// keepRules adds to p the header and placeholder rules of the sandbox's
// current policy that p does not replace (the same domain and header, or
// the same variable): header values are never shown, so they go back
// without one and the daemon keeps its own.
func keepRules(p *corral.NetworkPolicy, cur *corral.NetworkPolicy) {
	if cur == nil {
		return
	}
	for _, h := range cur.Headers {
		if !slices.ContainsFunc(p.Headers, func(n corral.HeaderRule) bool { return n.Domain == h.Domain && strings.EqualFold(n.Name, h.Name) }) {
			p.Headers = append(p.Headers, corral.HeaderRule{Domain: h.Domain, Name: h.Name})
		}
	}
	for _, r := range cur.Placeholders {
		if !slices.ContainsFunc(p.Placeholders, func(n corral.PlaceholderRule) bool { return n.Env == r.Env }) {
			p.Placeholders = append(p.Placeholders, r)
		}
	}
}

// network shows a sandbox's network policy or, with flags, replaces it
// live.
func (c *cli) network(args []string) int {
	fs := c.flags("network")
	var nf networkFlags
	nf.register(fs, "mode")
	id, err := parseNameFirst(fs, args)
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "usage: corral network ID [--mode none|allowlist|open] [--allow-domain D]... [--allow-cidr C]...\n"+
			"                      [--inject-header DOMAIN:HEADER=TEMPLATE]... [--placeholder ENV=SECRET@DOMAIN[,body]]...")
		return exitUsage
	}
	p, err := nf.policy()
	if err != nil {
		fmt.Fprintln(c.env.Stderr, err)
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
	if p != nil {
		// The flags replace the domains and CIDRs; header and placeholder
		// rules they do not name stay as they are.
		if sb, err = client.Get(ctx, id); err != nil {
			return c.fail(err)
		}
		keepRules(p, sb.Network)
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
	for _, r := range p.Placeholders {
		body := ""
		if r.Body {
			body = ",body"
		}
		fmt.Fprintf(w, "placeholder: %s=%s@%s%s\n", r.Env, r.Secret, r.Domain, body)
	}
}
