package daemon_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
	corral "github.com/corralrun/corral/sdk"
)

// TestServerJoinsCluster runs `corral server` with the cluster flags
// against a real etcd: the node registers, GET /v1/nodes lists it with
// its runtimes, templates, capacity and load as they change, and a clean
// stop removes its record.
func TestServerJoinsCluster(t *testing.T) {
	e := testutil.StartEtcd(t)
	d := daemontest.New(t, daemontest.Options{Name: "cluster", Storage: "overlay", Args: []string{
		"--cluster-etcd", e.Endpoint, "--node-name", "node-1", "--advertise", "127.0.0.1:7001", "--cluster-refresh", "200ms"}})
	ctx := t.Context()

	nodes, err := d.Client.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("nodes = %+v, want this one", nodes)
	}
	n := nodes[0]
	if n.Name != "node-1" || n.Advertise != "127.0.0.1:7001" || !slices.Contains(n.Runtimes, "runc") ||
		n.Capacity.MilliCPUs <= 0 || n.Capacity.MemoryBytes <= 0 || n.Load.Sandboxes != 0 || time.Since(n.UpdatedAt) > 5*time.Second {
		t.Fatalf("node record %+v", n)
	}

	d.BuildBusybox("bb")
	sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", CPUs: 0.5, MemoryMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	want := func(n corral.Node) bool {
		return slices.Equal(n.Templates, []string{"bb"}) && n.Load.Sandboxes == 1 && n.Load.Running == 1 &&
			n.Load.ReservedMilliCPUs == 500 && n.Load.ReservedMemoryBytes == 64<<20
	}
	deadline := time.Now().Add(5 * time.Second)
	for nodes, err = d.Client.Nodes(ctx); err != nil || len(nodes) != 1 || !want(nodes[0]); nodes, err = d.Client.Nodes(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("nodes = %+v, %v; want bb and one running sandbox of 0.5 CPU and 64M", nodes, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	d.Stop()
	c, err := cluster.Dial(ctx, []string{e.Endpoint}, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	left, err := c.List(context.Background())
	if err != nil || len(left) != 0 {
		t.Errorf("nodes after a clean stop = %+v, %v; want none", left, err)
	}
}
