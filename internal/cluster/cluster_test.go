package cluster_test

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/testutil"
)

const refresh = 200 * time.Millisecond

func dial(t *testing.T, e *testutil.Etcd) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Dial(t.Context(), []string{e.Endpoint}, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func describe(n cluster.Node) func(context.Context) cluster.Node {
	return func(context.Context) cluster.Node { return n }
}

func register(t *testing.T, c *cluster.Cluster, name, addr string, n cluster.Node) *cluster.Member {
	t.Helper()
	m, err := c.Register(t.Context(), cluster.Registration{Name: name, Advertise: addr, Refresh: refresh, TTL: 2 * time.Second, Describe: describe(n)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return m
}

func list(t *testing.T, c *cluster.Cluster) []cluster.Node {
	t.Helper()
	nodes, err := c.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

func names(nodes []cluster.Node) []string {
	out := []string{}
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

// waitNames polls List until it holds exactly want, within d.
func waitNames(t *testing.T, c *cluster.Cluster, d time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := names(list(t, c))
		if cmp.Equal(want, got, cmpopts.EquateEmpty()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes after %s = %q, want %q", d, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRegisterAndList(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	watch := c.Watch(t.Context())
	a := cluster.Node{Runtimes: []string{"gvisor", "runc"}, Templates: []string{"busybox"},
		Capacity: cluster.Capacity{MilliCPUs: 2000, MemoryBytes: 4 << 30},
		Load:     cluster.Load{Sandboxes: 3, Running: 2, MilliCPUs: 1500, MemoryBytes: 1 << 30}}
	b := cluster.Node{Runtimes: []string{"runc"}, Templates: []string{}, Capacity: cluster.Capacity{MilliCPUs: 8000, MemoryBytes: 16 << 30}}
	before := time.Now().UTC()
	register(t, c, "node-a", "10.0.0.1:7000", a)
	register(t, c, "node-b", "node-b.example:7000", b)

	a.Name, a.Advertise = "node-a", "10.0.0.1:7000"
	b.Name, b.Advertise = "node-b", "node-b.example:7000"
	got := list(t, c)
	if diff := cmp.Diff([]cluster.Node{a, b}, got, cmpopts.IgnoreFields(cluster.Node{}, "UpdatedAt")); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	for _, n := range got {
		if n.UpdatedAt.Before(before.Add(-time.Second)) || n.UpdatedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("%s updated_at = %s, want about now", n.Name, n.UpdatedAt)
		}
	}
	for _, want := range []string{"node-a", "node-b"} {
		select {
		case ev := <-watch:
			if ev.Name != want || ev.Node == nil || ev.Node.Name != want {
				t.Errorf("watch event = %+v, want a put of %s", ev, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no watch event for %s", want)
		}
	}
	// Records are rewritten at each refresh.
	first := got[0].UpdatedAt
	testutil.WaitFor(t, func() bool { return list(t, c)[0].UpdatedAt.After(first) })
}

func TestNameTaken(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	register(t, c, "node-a", "10.0.0.1:7000", cluster.Node{})
	_, err := c.Register(t.Context(), cluster.Registration{Name: "node-a", Advertise: "10.0.0.2:7000", Refresh: refresh, Describe: describe(cluster.Node{})})
	if err == nil {
		t.Fatal("a second node of the same name and another address registered")
	}
	// The same address is the same node, restarted before its lease expired.
	m := register(t, c, "node-a", "10.0.0.1:7000", cluster.Node{Templates: []string{"new"}})
	if got := list(t, c); len(got) != 1 || len(got[0].Templates) != 1 {
		t.Errorf("after a takeover: %+v", got)
	}
	if err := m.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestStopRemovesRecord(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	watch := c.Watch(t.Context())
	m := register(t, c, "node-a", "10.0.0.1:7000", cluster.Node{})
	if ev := <-watch; ev.Node == nil {
		t.Fatalf("first event %+v, want a put", ev)
	}
	if err := m.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := names(list(t, c)); len(got) != 0 {
		t.Errorf("nodes after Stop = %q, want none", got)
	}
	select {
	case ev := <-watch:
		if ev.Name != "node-a" || ev.Node != nil {
			t.Errorf("event %+v, want the delete of node-a", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no delete event")
	}
}

// TestNodeProcessKilled registers a node from a child process, kills it,
// and sees the record leave once its lease expires.
func TestNodeProcessKilled(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperNode$")
	cmd.Env = append(os.Environ(), "CORRAL_CLUSTER_HELPER_ETCD="+e.Endpoint)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitNames(t, c, 10*time.Second, "child")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()
	if got := names(list(t, c)); len(got) != 1 {
		t.Fatalf("the record left at once (%q): want it to last until its TTL", got)
	}
	waitNames(t, c, 5*time.Second)
	if d := time.Since(killed); d < time.Second {
		t.Errorf("the record left %s after the kill, before its 2s TTL could pass", d)
	}
}

// TestHelperNode is the child of TestNodeProcessKilled: it registers and
// refreshes until killed.
func TestHelperNode(t *testing.T) {
	endpoint := os.Getenv("CORRAL_CLUSTER_HELPER_ETCD")
	if endpoint == "" {
		t.Skip("run by TestNodeProcessKilled")
	}
	c, err := cluster.Dial(t.Context(), []string{endpoint}, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(t.Context(), cluster.Registration{Name: "child", Advertise: "127.0.0.1:1", Refresh: refresh, TTL: 2 * time.Second, Describe: describe(cluster.Node{})}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(t.Context(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}

// TestEtcdRestart stops etcd for longer than the lease's TTL and starts
// it again on the same data: the node's record is back and fresh.
func TestEtcdRestart(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	register(t, c, "node-a", "10.0.0.1:7000", cluster.Node{})
	e.Stop(t)
	time.Sleep(3 * time.Second)
	e.Start(t)
	var after time.Time
	testutil.WaitFor(t, func() bool {
		nodes, err := c.List(t.Context())
		if err != nil || len(nodes) != 1 {
			return false
		}
		after = nodes[0].UpdatedAt
		return time.Since(after) < time.Second
	})
	// The record stays, refreshed, for longer than a TTL.
	time.Sleep(2500 * time.Millisecond)
	nodes := list(t, c)
	if len(nodes) != 1 || !nodes[0].UpdatedAt.After(after) {
		t.Errorf("after the restart: %+v, want node-a refreshed after %s", nodes, after)
	}
}

// TestLeaseLost revokes the node's lease behind its back, as etcd does
// when the node was cut off for longer than its TTL: it registers again.
func TestLeaseLost(t *testing.T) {
	e := testutil.StartEtcd(t)
	c := dial(t, e)
	register(t, c, "node-a", "10.0.0.1:7000", cluster.Node{})
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	leases, err := raw.Leases(t.Context())
	if err != nil || len(leases.Leases) != 1 {
		t.Fatalf("leases = %+v, %v; want one", leases, err)
	}
	if _, err := raw.Revoke(t.Context(), leases.Leases[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := names(list(t, c)); len(got) != 0 {
		t.Fatalf("nodes after the revoke = %q", got)
	}
	waitNames(t, c, 5*time.Second, "node-a")
	leases, err = raw.Leases(t.Context())
	if err != nil || len(leases.Leases) != 1 {
		t.Fatalf("leases after registering again = %+v, %v; want one", leases, err)
	}
}

func TestChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"node-1", cluster.CheckName("node-1")},
		{"a", cluster.CheckName("a")},
		{"host:7000", cluster.CheckAdvertise("host:7000")},
		{"[::1]:7000", cluster.CheckAdvertise("[::1]:7000")},
	} {
		if tc.err != nil {
			t.Errorf("%s: %v", tc.name, tc.err)
		}
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"empty name", cluster.CheckName("")},
		{"upper case", cluster.CheckName("Node")},
		{"leading hyphen", cluster.CheckName("-a")},
		{"slash", cluster.CheckName("a/b")},
		{"no port", cluster.CheckAdvertise("host")},
		{"unspecified", cluster.CheckAdvertise("0.0.0.0:7000")},
		{"empty host", cluster.CheckAdvertise(":7000")},
		{"port 0", cluster.CheckAdvertise("host:0")},
		{"port name", cluster.CheckAdvertise("host:http")},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := cluster.ParseEndpoints(" "); err == nil {
		t.Error("no endpoints: accepted")
	}
	if _, err := cluster.ParseEndpoints("ftp://h:1"); err == nil {
		t.Error("ftp endpoint: accepted")
	}
	got, err := cluster.ParseEndpoints("http://a:2379, b:2379")
	if err != nil || !cmp.Equal(got, []string{"http://a:2379", "b:2379"}) {
		t.Errorf("ParseEndpoints = %q, %v", got, err)
	}
}
