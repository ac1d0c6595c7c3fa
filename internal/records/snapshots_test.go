package records

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/sandbox"
)

func TestSnapshotsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := sandbox.Snapshot{Name: "a", Kind: sandbox.SnapshotMemory, SandboxID: "x", Template: "t", Runtime: "gvisor",
		MemoryBytes: 64 << 20, Env: map[string]string{"K": "V"}, Metadata: map[string]string{"m": "1"}, CreatedAt: created, SizeBytes: 42}
	b := sandbox.Snapshot{Name: "b", Kind: sandbox.SnapshotFilesystem, Template: "t", Runtime: "runc", CreatedAt: created}
	for _, snap := range []sandbox.Snapshot{a, b} {
		if err := s.PutSnapshot(t.Context(), snap); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSnapshot(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(t.Context(), "missing"); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	s.Close()
	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]sandbox.Snapshot{a}, got); diff != "" {
		t.Fatalf("snapshots after reopen (-want +got):\n%s", diff)
	}
}
