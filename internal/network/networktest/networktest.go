// Package networktest is the conformance suite for the network layer the
// sandbox Manager uses (sandbox.Network), run by network.Manager and by
// the fake in package fakenet: Setup gives each mode its network and
// refuses an id in use, Teardown is idempotent, Update replaces a policy
// within its mode, Reconcile keeps what it is told to and tears down the
// rest, and nothing is left on the host once every network is gone.
package networktest

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
)

// Network is the method set of sandbox.Network, repeated here because the
// network package's own tests cannot import package sandbox (it imports
// network).
type Network interface {
	Setup(ctx context.Context, id string, p egress.Policy) (*network.Sandbox, error)
	Update(ctx context.Context, id string, p egress.Policy) error
	Teardown(ctx context.Context, id string) error
	Get(id string) (network.Sandbox, bool)
	Reconcile(ctx context.Context, keep map[string]egress.Policy) error
}

// Config is what an implementation's test tells the suite.
type Config struct {
	// New must return a fresh network layer with no networks for each
	// call, and arrange its Close with t.Cleanup.
	New func(t *testing.T) Network
	// Restart returns a network layer for the same host as n, as a
	// daemon restarted after a crash opens (n is not closed first), and
	// arranges its Close.
	Restart func(t *testing.T, n Network) Network
	// Policy reports the policy n enforces for id.
	Policy func(n Network, id string) egress.Policy
	// Leftovers lists what n holds on the host (namespaces, interfaces,
	// firewall rules), once pending teardowns are done. It is nil for an
	// implementation that holds nothing outside memory; the suite then
	// says so in the test log.
	Leftovers func(t *testing.T, n Network) []string
}

// Run runs the suite.
func Run(t *testing.T, c Config) {
	tests := []struct {
		name string
		fn   func(t *testing.T, c Config, n Network) Network
	}{
		{"SetupTeardown", testSetupTeardown},
		{"Update", testUpdate},
		{"Reconcile", testReconcile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.fn(t, c, c.New(t))
			checkNoLeaks(t, c, n)
		})
	}
}

// comparePrefixes lets cmp compare policies, which hold netip.Prefix.
var comparePrefixes = cmpopts.EquateComparable(netip.Prefix{})

func allowlist(t *testing.T, domains ...string) egress.Policy {
	t.Helper()
	p := egress.Policy{Mode: egress.ModeAllowlist}
	for _, d := range domains {
		p.Domains = append(p.Domains, egress.DomainRule{Name: d})
	}
	p, err := p.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkNoLeaks checks that the host holds nothing of n's once a case has
// torn down every network it set up.
func checkNoLeaks(t *testing.T, c Config, n Network) {
	t.Helper()
	if c.Leftovers == nil {
		t.Log("the implementation holds nothing on the host (no Config.Leftovers)")
		return
	}
	if left := c.Leftovers(t, n); len(left) > 0 {
		t.Errorf("left on the host: %v", left)
	}
}

func testSetupTeardown(t *testing.T, c Config, n Network) Network {
	ctx := t.Context()
	for _, mode := range []egress.Mode{egress.ModeNone, egress.ModeAllowlist, egress.ModeOpen} {
		t.Run(string(mode), func(t *testing.T) {
			id := "sb-" + string(mode)
			p := egress.Policy{Mode: mode}
			sb, err := n.Setup(ctx, id, p)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			if sb.ID != id || sb.Mode != mode || sb.NetNSPath == "" {
				t.Errorf("Setup = %+v, want id %s, mode %s and a namespace", sb, id, mode)
			}
			if link := mode != egress.ModeNone; sb.HostAddr.IsValid() != link || sb.Addr.IsValid() != link {
				t.Errorf("mode %s: host address %v, address %v", mode, sb.HostAddr, sb.Addr)
			}
			if got, ok := n.Get(id); !ok || got != *sb {
				t.Errorf("Get = %+v, %v; want %+v, true", got, ok, *sb)
			}
			if c.Leftovers != nil && len(c.Leftovers(t, n)) == 0 {
				t.Error("Leftovers sees nothing of a network that is set up")
			}
			if _, err := n.Setup(ctx, id, p); !errors.Is(err, errdefs.ErrAlreadyExists) {
				t.Errorf("second Setup = %v, want ErrAlreadyExists", err)
			}
			for i := range 2 {
				if err := n.Teardown(ctx, id); err != nil {
					t.Errorf("Teardown #%d: %v", i+1, err)
				}
			}
			if _, ok := n.Get(id); ok {
				t.Error("Get finds the network after Teardown")
			}
			// The id is free again.
			if _, err := n.Setup(ctx, id, p); err != nil {
				t.Errorf("Setup after Teardown: %v", err)
			}
			if err := n.Teardown(ctx, id); err != nil {
				t.Error(err)
			}
		})
	}
	if err := n.Teardown(ctx, "never-set-up"); err != nil {
		t.Errorf("Teardown of an unknown id: %v", err)
	}
	return n
}

func testUpdate(t *testing.T, c Config, n Network) Network {
	ctx := t.Context()
	for _, id := range []string{"filtered", "none"} {
		p := allowlist(t, "a.test")
		if id == "none" {
			p = egress.Policy{Mode: egress.ModeNone}
		}
		if _, err := n.Setup(ctx, id, p); err != nil {
			t.Fatal(err)
		}
	}
	want := allowlist(t, "b.test", "c.test")
	if err := n.Update(ctx, "filtered", want); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if diff := cmp.Diff(want, c.Policy(n, "filtered"), comparePrefixes); diff != "" {
		t.Errorf("policy after Update (-want +got):\n%s", diff)
	}
	open := egress.Policy{Mode: egress.ModeOpen}
	if err := n.Update(ctx, "filtered", open); err != nil {
		t.Errorf("Update from allowlist to open: %v", err)
	}
	if err := n.Update(ctx, "filtered", egress.Policy{Mode: egress.ModeNone}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Update to mode none = %v, want ErrFailedPrecondition", err)
	}
	if err := n.Update(ctx, "none", open); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Update from mode none = %v, want ErrFailedPrecondition", err)
	}
	if got := c.Policy(n, "filtered").Mode; got != egress.ModeOpen {
		t.Errorf("mode after a refused Update = %s, want open", got)
	}
	if err := n.Update(ctx, "unknown", open); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update of an unknown id = %v, want ErrNotFound", err)
	}
	for _, id := range []string{"filtered", "none"} {
		if err := n.Teardown(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if err := n.Update(ctx, "filtered", want); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update after Teardown = %v, want ErrNotFound", err)
	}
	return n
}

// testReconcile checks that a restarted network layer adopts the networks
// it is told to keep, with the policies it is given, and tears down the
// others.
func testReconcile(t *testing.T, c Config, n Network) Network {
	ctx := t.Context()
	for id, mode := range map[string]egress.Mode{"gone": egress.ModeAllowlist, "gone-none": egress.ModeNone,
		"kept": egress.ModeAllowlist, "kept-none": egress.ModeNone} {
		if _, err := n.Setup(ctx, id, egress.Policy{Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	n = c.Restart(t, n)
	kept := allowlist(t, "allowed.test")
	keep := map[string]egress.Policy{"kept": kept, "kept-none": {Mode: egress.ModeNone}, "missing": allowlist(t)}
	err := n.Reconcile(ctx, keep)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Reconcile = %v, want ErrNotFound for the missing sandbox", err)
	}
	for id, want := range map[string]bool{"gone": false, "gone-none": false, "kept": true, "kept-none": true, "missing": false} {
		if _, ok := n.Get(id); ok != want {
			t.Errorf("after Reconcile, Get(%s) finds a network: %v, want %v", id, ok, want)
		}
	}
	if diff := cmp.Diff(kept, c.Policy(n, "kept"), comparePrefixes); diff != "" {
		t.Errorf("kept policy after Reconcile (-want +got):\n%s", diff)
	}
	if err := n.Update(ctx, "kept", allowlist(t, "other.test")); err != nil {
		t.Errorf("Update after adoption: %v", err)
	}
	for _, id := range []string{"kept", "kept-none"} {
		if err := n.Teardown(ctx, id); err != nil {
			t.Error(err)
		}
	}
	return n
}
