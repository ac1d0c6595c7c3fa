package mcp

import (
	"flag"
	"fmt"
	"strings"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// DefaultMaxSandboxes is how many sandboxes a session may hold unless the
// operator says otherwise.
const DefaultMaxSandboxes = 10

// Flags registers the flags of a Policy on fs, each name preceded by
// prefix ("" for `corral mcp`, "mcp-" for `corral server`). Call Check
// after parsing.
func (p *Policy) Flags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&p.Template, prefix+"template", "", "template of sandboxes created without one, the session's own among them (default: the daemon's)")
	fs.Var(listFlag{&p.Runtimes}, prefix+"allow-runtime", "runtime MCP clients may ask for, the first the default (repeatable or comma-separated; default: any)")
	p.MaxSandboxes = DefaultMaxSandboxes
	fs.IntVar(&p.MaxSandboxes, prefix+"max-sandboxes", DefaultMaxSandboxes, "most sandboxes one MCP session may hold at once, its own included (0: no limit)")
	p.Network.Mode = corral.NetworkNone
	fs.StringVar(&p.Network.Mode, prefix+"network", corral.NetworkNone, "network of sandboxes MCP clients create, and the most they may ask for: none, allowlist or open")
	fs.Var(listFlag{&p.Network.AllowDomains}, prefix+"allow-domain", "with --"+prefix+"network allowlist: a domain sandboxes may reach, NAME[:PORT,...] or *.NAME (repeatable)")
	fs.Var(listFlag{&p.Network.AllowCIDRs}, prefix+"allow-cidr", "with --"+prefix+"network allowlist: an IPv4 range sandboxes may reach, ADDRESS[/BITS][:PORT,...] (repeatable)")
	fs.DurationVar(&p.SessionIdle, prefix+"session-idle", 30*time.Minute, "delete a session's own sandbox after it was unused this long")
	fs.DurationVar(&p.SessionTimeout, prefix+"session-timeout", 0, "most a session's own sandbox lives (0: until the session ends; a daemon with --max-timeout needs one)")
}

// Check validates a policy read from flags, splitting comma-separated
// runtimes and filling in defaults (network none, idle 30 minutes).
func (p *Policy) Check() error {
	if p.Network.Mode == "" {
		p.Network.Mode = corral.NetworkNone
	}
	if p.SessionIdle == 0 {
		p.SessionIdle = 30 * time.Minute
	}
	var runtimes []string
	for _, r := range p.Runtimes {
		for _, name := range strings.Split(r, ",") {
			if name = strings.TrimSpace(name); name != "" {
				runtimes = append(runtimes, name)
			}
		}
	}
	p.Runtimes = runtimes
	switch p.Network.Mode {
	case corral.NetworkNone, corral.NetworkOpen:
		if len(p.Network.AllowDomains)+len(p.Network.AllowCIDRs) > 0 {
			return fmt.Errorf("domain and address rules need network mode allowlist, not %s", p.Network.Mode)
		}
	case corral.NetworkAllowlist:
		if len(p.Network.AllowDomains)+len(p.Network.AllowCIDRs) == 0 {
			return fmt.Errorf("network mode allowlist needs a domain or address rule")
		}
		for _, d := range p.Network.AllowDomains {
			if _, _, ok := splitPorts(d); !ok {
				return fmt.Errorf("domain rule %q: ports must be numbers from 1 to 65535", d)
			}
		}
		for _, c := range p.Network.AllowCIDRs {
			a, _, ok := splitPorts(c)
			if _, err := parsePrefix(a); !ok || err != nil {
				return fmt.Errorf("address rule %q is not ADDRESS[/BITS][:PORT,...]", c)
			}
		}
	default:
		return fmt.Errorf("network mode %q is not none, allowlist or open", p.Network.Mode)
	}
	if p.MaxSandboxes < 0 {
		return fmt.Errorf("max sandboxes %d is negative", p.MaxSandboxes)
	}
	if p.SessionIdle <= 0 {
		return fmt.Errorf("session idle timeout %s must be positive", p.SessionIdle)
	}
	if p.SessionTimeout < 0 {
		return fmt.Errorf("session timeout %s is negative", p.SessionTimeout)
	}
	return nil
}

// listFlag is a repeatable flag; each use adds one value.
type listFlag struct{ v *[]string }

func (f listFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f listFlag) Set(s string) error {
	if s == "" {
		return fmt.Errorf("empty value")
	}
	*f.v = append(*f.v, s)
	return nil
}
