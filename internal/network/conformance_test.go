package network_test

import (
	"testing"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/network/networktest"
)

// TestConformance runs the network suite on Managers of a test config of
// their own; a restart is a second Manager on the same config.
func TestConformance(t *testing.T) {
	networktest.Run(t, networktest.Config{
		New: func(t *testing.T) networktest.Network { return network.NewConformanceManager(t) },
		Restart: func(t *testing.T, n networktest.Network) networktest.Network {
			return n.(*network.Manager).Restarted(t)
		},
		Policy: func(n networktest.Network, id string) egress.Policy {
			return n.(*network.Manager).PolicyOf(id)
		},
		Leftovers: func(t *testing.T, n networktest.Network) []string {
			return n.(*network.Manager).Leftovers(t)
		},
	})
}
