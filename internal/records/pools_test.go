package records

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/sandbox"
)

func TestPoolsAndLifecycleSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	a := sandbox.Pool{Name: "a", Template: "t", Runtime: "runc", MilliCPUs: 500, MemoryBytes: 64 << 20, Network: egress.ModeNone, Size: 8}
	b := sandbox.Pool{Name: "b", Template: "t", Runtime: "gvisor", Network: egress.ModeOpen, Size: 1}
	for _, p := range []sandbox.Pool{a, b, {Name: "gone", Size: 1}} {
		if err := s.PutPool(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	a.Size = 2
	if err := s.PutPool(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePool(t.Context(), "gone"); err != nil {
		t.Fatal(err)
	}
	sb := sandbox.Sandbox{ID: "x", State: sandbox.StateRunning, Pool: "a", IdleTimeout: 90 * time.Second,
		OnDeadline: sandbox.ActionPause, OnIdle: sandbox.ActionDestroy}
	if err := s.PutSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Pools(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]sandbox.Pool{a, b}, got); diff != "" {
		t.Fatalf("pools after reopen (-want +got):\n%s", diff)
	}
	sbs, err := s.Sandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]sandbox.Sandbox{sb}, sbs); diff != "" {
		t.Fatalf("sandboxes after reopen (-want +got):\n%s", diff)
	}
}
