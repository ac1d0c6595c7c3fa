package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

// TestSparesRefill checks the automatic part: a kind is made once Setup
// asked for it, SpareDelay later, and the next Setup takes it; Reconcile
// leaves the Manager's own spares alone; Close removes them.
func TestSparesRefill(t *testing.T) {
	cfg := testConfig(t)
	cfg.Spares = 2
	cfg.SpareDelay = 10 * time.Millisecond
	m := newTestManager(t, cfg)
	ctx := t.Context()
	if err := m.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var ready []string // the spares' interfaces before each Setup
	for _, id := range []string{"first", "second"} {
		sb, err := m.Setup(ctx, id, egress.Policy{Mode: egress.ModeAllowlist})
		if err != nil {
			t.Fatal(err)
		}
		if spared := slices.Contains(ready, sb.HostIface); spared != (id == "second") {
			t.Errorf("%s: interface %s, spares %v: taken from a spare %v", id, sb.HostIface, ready, spared)
		}
		testutil.WaitFor(t, func() bool { return m.spareCount(1) == cfg.Spares })
		ready = nil
		m.mu.Lock()
		for _, sp := range m.spares[1] {
			ready = append(ready, m.ifaceName(sp.slot))
		}
		m.mu.Unlock()
	}
	if n := m.spareCount(0); n != 0 {
		t.Errorf("%d spares of mode none, which no Setup asked for", n)
	}
	if err := m.Reconcile(ctx, map[string]egress.Policy{
		"first": {Mode: egress.ModeAllowlist}, "second": {Mode: egress.ModeAllowlist},
	}); err != nil {
		t.Fatal(err)
	}
	if n := m.spareCount(1); n != cfg.Spares {
		t.Errorf("Reconcile left %d spares of %d", n, cfg.Spares)
	}
	m.mu.Lock()
	spares := append([]spare(nil), m.spares[1]...)
	m.mu.Unlock()
	for _, sp := range spares {
		if _, err := m.nl.LinkByName(m.ifaceName(sp.slot)); err != nil {
			t.Errorf("spare %s lost its veth: %v", sp.name, err)
		}
	}
	// newTestManager's cleanup tears the two down, closes m and checks
	// that nothing, spares included, is left.
}

// TestSparesAfterCrash plays a daemon killed with spares made: the next
// Manager removes their namespaces (New) and veths (Reconcile).
func TestSparesAfterCrash(t *testing.T) {
	cfg := testConfig(t)
	cfg.Spares = 2
	cfg.SpareDelay = time.Hour
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forceClean(cfg) })
	makeSpares(t, first, true)
	if n := first.spareCount(0) + first.spareCount(1); n != 2*cfg.Spares {
		t.Fatalf("%d spares, want %d", n, 2*cfg.Spares)
	}
	first.nl.Close() // the crash: nothing else of first is undone

	m := newTestManager(t, cfg)
	if err := m.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	m.waitReaped()
	assertClean(t, cfg, false)
}

func (m *Manager) spareCount(kind int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.spares[kind])
}

// TestSparesLeaveAddresses: spares with a veth are not made when only
// Config.Spares addresses are left, so that they never hold the
// addresses Setup needs.
func TestSparesLeaveAddresses(t *testing.T) {
	cfg := testConfig(t)
	cfg.Subnet = netip.PrefixFrom(cfg.Subnet.Addr(), 28) // four sandboxes
	cfg.Spares = 2
	cfg.SpareDelay = time.Hour
	m := newTestManager(t, cfg)
	ctx := t.Context()
	makeSpares(t, m, true)
	for i := range 4 {
		if _, err := m.Setup(ctx, fmt.Sprintf("sb%d", i), egress.Policy{Mode: egress.ModeAllowlist}); err != nil {
			t.Fatalf("Setup %d of 4: %v", i, err)
		}
		m.spareRefill.Run()
		m.mu.Lock()
		free := m.slots - len(m.used)
		m.mu.Unlock()
		if n := m.spareCount(1); n > 0 && free < cfg.Spares {
			t.Errorf("after Setup %d: %d spares made, %d addresses left", i, n, free)
		}
	}
	if n := m.spareCount(1); n != 0 {
		t.Errorf("%d spares hold addresses of a full subnet", n)
	}
	if _, err := m.Setup(ctx, "sb4", egress.Policy{Mode: egress.ModeAllowlist}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("fifth Setup: %v, want resource exhausted", err)
	}
}
