// Package fakenet is an in-memory stand-in for network.Manager, for tests
// of the layers above the network: it keeps each sandbox's policy and
// follows the Manager's rules for duplicate setups, mode changes,
// idempotent teardowns and reconciling, without touching the host.
package fakenet

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
)

// Network is the fake. Safe for concurrent use.
type Network struct {
	mu        sync.Mutex
	nets      map[string]egress.Policy
	failSetup error
	// tearBlock, when set, is received from by every Teardown before it
	// proceeds.
	tearBlock chan struct{}
}

// New returns a fake with no networks.
func New() *Network { return &Network{nets: map[string]egress.Policy{}} }

func (f *Network) sandbox(id string, p egress.Policy) network.Sandbox {
	sb := network.Sandbox{ID: id, Mode: p.Mode, NetNSPath: "/fake/netns/" + id, Ports: egress.DefaultServerPorts()}
	if p.Mode != egress.ModeNone {
		sb.HostAddr = netip.MustParseAddr("10.99.0.1")
		sb.Addr = netip.MustParsePrefix("10.99.0.2/30")
	}
	return sb
}

// Setup records id's network with policy p; an id in use fails with
// errdefs.ErrAlreadyExists, and every Setup fails with the error that
// FailSetup set, if any.
func (f *Network) Setup(_ context.Context, id string, p egress.Policy) (*network.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failSetup != nil {
		return nil, f.failSetup
	}
	if _, ok := f.nets[id]; ok {
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "fake network %s exists", id)
	}
	f.nets[id] = p
	sb := f.sandbox(id, p)
	return &sb, nil
}

// Update replaces id's policy; unknown ids fail with errdefs.ErrNotFound
// and a change to or from mode none with errdefs.ErrFailedPrecondition.
func (f *Network) Update(_ context.Context, id string, p egress.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.nets[id]
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "fake network %s not found", id)
	}
	if (old.Mode == egress.ModeNone) != (p.Mode == egress.ModeNone) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "fake: mode %s to %s", old.Mode, p.Mode)
	}
	f.nets[id] = p
	return nil
}

// Teardown forgets id's network; idempotent.
func (f *Network) Teardown(_ context.Context, id string) error {
	f.mu.Lock()
	block := f.tearBlock
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nets, id)
	return nil
}

// Get returns id's network and whether it is set up.
func (f *Network) Get(id string) (network.Sandbox, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.nets[id]
	return f.sandbox(id, p), ok
}

// Reconcile keeps the networks of keep with keep's policies and tears
// down the others; ids of keep that have no network fail with
// errdefs.ErrNotFound, all joined.
func (f *Network) Reconcile(_ context.Context, keep map[string]egress.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for id := range f.nets {
		if p, ok := keep[id]; ok {
			f.nets[id] = p
		} else {
			delete(f.nets, id)
		}
	}
	for id := range keep {
		if _, ok := f.nets[id]; !ok {
			errs = append(errs, errdefs.Errorf(errdefs.ErrNotFound, "fake network %s not on the host", id))
		}
	}
	return errors.Join(errs...)
}

// IDs returns the ids with a network, sorted.
func (f *Network) IDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.nets))
}

// Policy returns id's policy (zero when it has no network).
func (f *Network) Policy(id string) egress.Policy {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nets[id]
}

// FailSetup makes every later Setup fail with err; nil clears it.
func (f *Network) FailSetup(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failSetup = err
}

// BlockTeardowns makes every later Teardown wait until the returned
// function is called.
func (f *Network) BlockTeardowns() (release func()) {
	block := make(chan struct{})
	f.mu.Lock()
	f.tearBlock = block
	f.mu.Unlock()
	return sync.OnceFunc(func() { close(block) })
}

// Lose forgets id's network without a teardown, as a host reboot does.
func (f *Network) Lose(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nets, id)
}

// Plant records a network for id that nobody set up, as a crash leaves
// one behind.
func (f *Network) Plant(id string, p egress.Policy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nets[id] = p
}
