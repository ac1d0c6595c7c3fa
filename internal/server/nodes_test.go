package server

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/errdefs"
	corral "github.com/corralrun/corral/sdk"
)

// fakeNodes lists fixed nodes, or fails with err.
type fakeNodes struct {
	nodes []cluster.Node
	err   error
}

func (f fakeNodes) List(context.Context) ([]cluster.Node, error) { return f.nodes, f.err }

func TestNodes(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	nodes := []cluster.Node{{Name: "a", Advertise: "10.0.0.1:7000", Runtimes: []string{"runc"}, Templates: []string{"bb"},
		Capacity: cluster.Capacity{MilliCPUs: 2000, MemoryBytes: 4 << 30},
		Load:     cluster.Load{Sandboxes: 2, Running: 1, MilliCPUs: 500, MemoryBytes: 256 << 20}, UpdatedAt: at}}
	for _, tc := range []struct {
		name     string
		nodes    NodeLister
		want     []corral.Node
		wantCode string
	}{
		{name: "not in a cluster", wantCode: corral.CodeFailedPrecondition},
		{name: "etcd unreachable", nodes: fakeNodes{err: errdefs.Errorf(errdefs.ErrUnavailable, "etcd down")}, wantCode: corral.CodeUnavailable},
		{name: "listed", nodes: fakeNodes{nodes: nodes}, want: []corral.Node{{Name: "a", Advertise: "10.0.0.1:7000",
			Runtimes: []string{"runc"}, Templates: []string{"bb"},
			Capacity: corral.NodeCapacity{MilliCPUs: 2000, MemoryBytes: 4 << 30},
			Load:     corral.NodeLoad{Sandboxes: 2, Running: 1, ReservedMilliCPUs: 500, ReservedMemoryBytes: 256 << 20}, UpdatedAt: at}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newTestServerWith(t, "", func(cfg *Config) { cfg.Nodes = tc.nodes })
			got, err := c.Nodes(t.Context())
			if code := corral.ErrorCode(err); code != tc.wantCode {
				t.Fatalf("Nodes: %v, want code %q", err, tc.wantCode)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Nodes (-want +got):\n%s", diff)
			}
		})
	}
}

// A tenant's key may not list the nodes: they describe the whole
// installation.
func TestNodesNeedAdmin(t *testing.T) {
	admin, ts := newTestServerWith(t, "admin-secret", func(cfg *Config) { cfg.Nodes = fakeNodes{} })
	if _, err := admin.Nodes(t.Context()); err != nil {
		t.Fatalf("admin: %v", err)
	}
	k, err := admin.CreateKey(t.Context(), corral.KeyOptions{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := corral.New(ts.URL, k.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	if _, err := tenant.Nodes(t.Context()); corral.ErrorCode(err) != corral.CodePermissionDenied {
		t.Errorf("tenant: %v, want permission_denied", err)
	}
}
