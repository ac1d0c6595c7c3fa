package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/sandbox"
)

// clusterDialTimeout bounds the wait for etcd at start: a daemon that
// cannot reach it fails rather than serving outside the cluster.
const clusterDialTimeout = 10 * time.Second

// clusterFlags are the flags of joining a cluster.
func clusterFlags(fs *flag.FlagSet, cfg *Config) {
	fs.Var(endpointsFlag{&cfg.ClusterEtcd}, "cluster-etcd", "join the cluster whose etcd answers at these endpoints, HOST:PORT or http(s)://HOST:PORT, comma-separated (default: no cluster)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "this node's name in the cluster: lowercase letters, digits and hyphens (needs --cluster-etcd)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "HOST:PORT at which the other nodes reach this node's API (needs --cluster-etcd)")
	fs.DurationVar(&cfg.ClusterRefresh, "cluster-refresh", cluster.DefaultRefresh, "how often this node rewrites its cluster record; it expires after three of these without one")
}

// endpointsFlag parses --cluster-etcd with cluster.ParseEndpoints.
type endpointsFlag struct{ v *[]string }

func (f endpointsFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f endpointsFlag) Set(s string) error {
	e, err := cluster.ParseEndpoints(s)
	if err != nil {
		return err
	}
	*f.v = append(*f.v, e...)
	return nil
}

// checkCluster checks the cluster settings: all of them or none.
func (c *Config) checkCluster() error {
	if len(c.ClusterEtcd) == 0 {
		if c.NodeName != "" || c.Advertise != "" {
			return errors.New("--node-name and --advertise need --cluster-etcd")
		}
		return nil
	}
	if c.NodeName == "" {
		return errors.New("--cluster-etcd needs --node-name")
	}
	if c.Advertise == "" {
		return errors.New("--cluster-etcd needs --advertise: the address at which the other nodes reach this node's API")
	}
	if err := cluster.CheckName(c.NodeName); err != nil {
		return fmt.Errorf("--node-name: %w", err)
	}
	if err := cluster.CheckAdvertise(c.Advertise); err != nil {
		return fmt.Errorf("--advertise: %w", err)
	}
	if c.ClusterRefresh < 0 {
		return errors.New("--cluster-refresh must not be negative")
	}
	return nil
}

// dialCluster connects to the cluster's etcd when Config.ClusterEtcd
// names it, before the API serves the nodes it lists.
func (d *Daemon) dialCluster(ctx context.Context) error {
	if len(d.cfg.ClusterEtcd) == 0 {
		return nil
	}
	c, err := cluster.Dial(ctx, d.cfg.ClusterEtcd, clusterDialTimeout, d.log.With("component", "cluster"))
	if err != nil {
		return err
	}
	d.cluster = c
	return nil
}

// joinCluster registers this node once it serves, with a record of
// what its Manager offers and holds, refreshed until Stop.
func (d *Daemon) joinCluster(ctx context.Context) error {
	if d.cluster == nil {
		return nil
	}
	cpus, mem, err := d.cfg.Admission.Host()
	if err != nil {
		return fmt.Errorf("reading this node's capacity: %w", err)
	}
	m := d.manager
	capacity := cluster.Capacity{MilliCPUs: cpus, MemoryBytes: mem}
	describe := func(ctx context.Context) cluster.Node {
		return describeNode(ctx, m, capacity)
	}
	d.member, err = d.cluster.Register(ctx, cluster.Registration{Name: d.cfg.NodeName, Advertise: d.cfg.Advertise,
		Refresh: d.cfg.ClusterRefresh, Describe: describe})
	if err != nil {
		return err
	}
	d.log.Info("joined the cluster", "node", d.cfg.NodeName, "advertise", d.cfg.Advertise, "etcd", strings.Join(d.cfg.ClusterEtcd, ","))
	return nil
}

// describeNode is this node's cluster record: its runtimes, the
// templates it holds (every tenant's), its capacity and its load.
func describeNode(ctx context.Context, m *sandbox.Manager, capacity cluster.Capacity) cluster.Node {
	n := cluster.Node{Capacity: capacity, Runtimes: []string{}, Templates: []string{}}
	for _, r := range m.Runtimes() {
		n.Runtimes = append(n.Runtimes, r.Name)
	}
	for _, t := range m.Templates(ctx) {
		n.Templates = append(n.Templates, t.Name)
	}
	l := m.Load()
	n.Load = cluster.Load{Sandboxes: l.Sandboxes, Running: l.Running, MilliCPUs: l.MilliCPUs, MemoryBytes: l.MemoryBytes}
	return n
}

// leaveCluster removes this node's record, so that the others stop
// seeing it at once rather than after its lease's TTL.
func (d *Daemon) leaveCluster(ctx context.Context) {
	if d.member == nil {
		return
	}
	if err := d.member.Stop(ctx); err != nil {
		d.log.Warn("leaving the cluster: the record stays until its lease expires", "err", err)
	}
	d.member = nil
}
