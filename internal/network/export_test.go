package network

import (
	"testing"

	"github.com/corralrun/corral/internal/egress"
)

// The hooks below let conformance_test.go, an external test package
// because networktest imports this package, drive Managers as this
// package's own tests do.

// NewConformanceManager returns a Manager on a test config of its own, with
// newTestManager's cleanup and leak checks.
func NewConformanceManager(t *testing.T) *Manager {
	cfg := testConfig(t)
	cfg.Egress = newFakeEgress()
	return newTestManager(t, cfg)
}

// Restarted returns a second Manager on m's config, as a daemon restarted
// after a crash opens; m is left as the crash left it.
func (m *Manager) Restarted(t *testing.T) *Manager {
	cfg := m.cfg
	cfg.Egress = newFakeEgress()
	return newTestManager(t, cfg)
}

// PolicyOf returns the policy m applies to id (zero when m has no network
// for id).
func (m *Manager) PolicyOf(id string) egress.Policy {
	e := m.get(id)
	if e == nil {
		return egress.Policy{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.policy
}

// Leftovers waits for pending teardowns and lists m's objects on the host
// (see leftovers), its table aside.
func (m *Manager) Leftovers(t *testing.T) []string {
	m.waitReaped()
	return leftovers(t, m.cfg, false)
}
