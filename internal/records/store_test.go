package records

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/sandbox"
)

func TestSandboxesSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := sandbox.Sandbox{ID: "a", Template: "t", Runtime: "runc", State: sandbox.StateCreating,
		MemoryBytes: 64 << 20, Env: map[string]string{"K": "V"}, Metadata: map[string]string{"m": "1"},
		CreatedAt: created, Deadline: created.Add(time.Minute)}
	b := sandbox.Sandbox{ID: "b", Template: "t", Runtime: "runc", State: sandbox.StateRunning, CreatedAt: created}
	for _, sb := range []sandbox.Sandbox{a, b} {
		if err := s.PutSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
	}
	a.State = sandbox.StateRunning
	if err := s.PutSandbox(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(t.Context(), "missing"); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	if err := s.PutTemplate(t.Context(), sandbox.Template{Name: "t", Tenant: "acme", Source: "busybox", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Sandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]sandbox.Sandbox{a}, got); diff != "" {
		t.Fatalf("sandboxes after reopen (-want +got):\n%s", diff)
	}
	tmpls, err := s.Templates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]sandbox.Template{{Name: "t", Tenant: "acme", Source: "busybox", CreatedAt: created}}, tmpls); diff != "" {
		t.Fatalf("templates (-want +got):\n%s", diff)
	}
	if err := s.DeleteTemplate(t.Context(), "t"); err != nil {
		t.Fatal(err)
	}
}
