package fakenet_test

import (
	"testing"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/network/fakenet"
	"github.com/corralrun/corral/internal/network/networktest"
	"github.com/corralrun/corral/internal/sandbox"
)

var _ sandbox.Network = (*fakenet.Network)(nil)

// TestConformance runs the network suite. The fake's state stands for the
// host's, so a restarted fake is the same one.
func TestConformance(t *testing.T) {
	networktest.Run(t, networktest.Config{
		New:     func(*testing.T) networktest.Network { return fakenet.New() },
		Restart: func(_ *testing.T, n networktest.Network) networktest.Network { return n },
		Policy: func(n networktest.Network, id string) egress.Policy {
			return n.(*fakenet.Network).Policy(id)
		},
	})
}
