package corral

import (
	"context"
	"net/url"
)

// Network modes.
const (
	// NetworkNone gives a sandbox loopback only.
	NetworkNone = "none"
	// NetworkAllowlist lets a sandbox reach the listed domains and CIDRs.
	NetworkAllowlist = "allowlist"
	// NetworkOpen lets a sandbox reach any public address and name.
	NetworkOpen = "open"
)

// NetworkPolicy is what a sandbox may reach; the daemon enforces it on
// the host. Mode is NetworkNone, NetworkAllowlist or NetworkOpen; empty
// means allowlist when rules are given and the daemon's default otherwise
// at create, and the current mode in UpdateNetwork.
//
// AllowDomains holds "NAME" or "NAME:PORT[,PORT...]" (NAME may start with
// "*."; ports default to 80 and 443). AllowCIDRs holds "ADDRESS[/BITS]"
// or "ADDRESS[/BITS]:PORT[,PORT...]" (IPv4); a rule inside a private,
// loopback or link-local range, or naming one address, opens it.
type NetworkPolicy struct {
	Mode         string            `json:"mode,omitempty"`
	AllowDomains []string          `json:"allow_domains,omitempty"`
	AllowCIDRs   []string          `json:"allow_cidrs,omitempty"`
	Headers      []HeaderRule      `json:"headers,omitempty"`
	Placeholders []PlaceholderRule `json:"placeholders,omitempty"`
}

// HeaderRule is a header the daemon's proxy sets on requests to Domain,
// so the secret in Value never enters the sandbox. Value may name secrets
// of the sandbox's tenant as {{secret:NAME}} (CreateSecret). The daemon
// never returns Value: policies read back have it empty, and a rule sent
// back to UpdateNetwork without one keeps the sandbox's value.
type HeaderRule struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	Value  string `json:"value,omitempty"`
}

// PlaceholderRule gives the sandbox's processes an environment variable
// Env holding a stand-in, made by the daemon, for the tenant's secret
// Secret; the daemon's proxy swaps the stand-in for the secret in
// requests to Domain (headers, and bodies with Body). A secret the
// tenant does not have is refused with CodeInvalidArgument.
type PlaceholderRule struct {
	Domain string `json:"domain"`
	Env    string `json:"env"`
	Secret string `json:"secret"`
	Body   bool   `json:"body,omitempty"`
}

// UpdateNetwork replaces a running sandbox's network policy. It takes
// effect at once for new connections and DNS queries. A header rule
// without a value keeps the sandbox's value for the same domain and
// header. Switching to or from NetworkNone fails with
// CodeFailedPrecondition: it needs a new sandbox.
func (c *Client) UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, p, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
