package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultRefresh is how often a member rewrites its record when its
// Registration names no interval.
const DefaultRefresh = 5 * time.Second

// Registration says how a node registers itself.
type Registration struct {
	Name      string // CheckName
	Advertise string // CheckAdvertise
	// Refresh is how often the record is rewritten and the lease renewed
	// (default DefaultRefresh). TTL is the lease's, in whole seconds
	// (default three refreshes, at least 2s): how long the record
	// outlives the node's last refresh.
	Refresh, TTL time.Duration
	// Describe fills in a record's runtimes, templates, capacity and
	// load; it is called at every refresh and must not block for long.
	// Name, Advertise and UpdatedAt are set by the member.
	Describe func(context.Context) Node
}

func (r *Registration) check() error {
	if err := CheckName(r.Name); err != nil {
		return err
	}
	if err := CheckAdvertise(r.Advertise); err != nil {
		return err
	}
	if r.Describe == nil {
		return errors.New("a registration needs Describe")
	}
	if r.Refresh <= 0 {
		r.Refresh = DefaultRefresh
	}
	if r.TTL == 0 {
		r.TTL = max(3*r.Refresh, 2*time.Second)
	}
	r.TTL = r.TTL.Round(time.Second)
	if r.TTL <= r.Refresh {
		return fmt.Errorf("the lease TTL (%s) must be longer than the refresh interval (%s)", r.TTL, r.Refresh)
	}
	return nil
}

// Member is a node registered in the cluster: it keeps the node's record
// and lease alive until Stop.
type Member struct {
	c     *Cluster
	reg   Registration
	key   string
	lease clientv3.LeaseID // owned by run until it returns
	stop  context.CancelFunc
	done  chan struct{}
}

// Register writes the node's record under a new lease and keeps it
// fresh from a goroutine of its own: each refresh renews the lease and
// rewrites the record; a lease that etcd no longer knows (it expired
// while etcd was unreachable) is replaced by a new one. It fails if the
// first write fails, or if a live node of another advertise address
// holds the name.
func (c *Cluster) Register(ctx context.Context, reg Registration) (*Member, error) {
	if err := reg.check(); err != nil {
		return nil, err
	}
	m := &Member{c: c, reg: reg, key: Prefix + reg.Name, done: make(chan struct{})}
	wctx, cancel := context.WithTimeout(ctx, reg.Refresh+reg.TTL)
	defer cancel()
	if err := m.register(wctx, true); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.stop = stop
	go m.run(runCtx)
	return m, nil
}

// register grants a lease and writes the record under it. With fresh, it
// refuses a name another live lease holds: two daemons must not share
// one.
func (m *Member) register(ctx context.Context, fresh bool) error {
	val, err := m.record(ctx)
	if err != nil {
		return err
	}
	lease, err := m.c.cli.Grant(ctx, int64(m.reg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("granting a lease for node %s: %w", m.reg.Name, err)
	}
	put := clientv3.OpPut(m.key, val, clientv3.WithLease(lease.ID))
	txn := m.c.cli.Txn(ctx)
	if fresh {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0)).Then(put).Else(clientv3.OpGet(m.key))
	} else {
		txn = txn.Then(put)
	}
	resp, err := txn.Commit()
	if err == nil && !resp.Succeeded {
		err = m.takeOver(ctx, resp, put)
	}
	if err != nil {
		m.revoke(lease.ID)
		return fmt.Errorf("registering node %s: %w", m.reg.Name, err)
	}
	m.lease = lease.ID
	return nil
}

// takeOver replaces a live record of the node's name that has the same
// advertise address: that of this node before a restart, whose lease has
// not expired yet. A record of another address is another node's.
func (m *Member) takeOver(ctx context.Context, resp *clientv3.TxnResponse, put clientv3.Op) error {
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 1 {
		var old Node
		if json.Unmarshal(kvs[0].Value, &old) == nil && old.Advertise != m.reg.Advertise {
			return fmt.Errorf("node name %s is taken by a live node at %s", m.reg.Name, old.Advertise)
		}
	}
	_, err := m.c.cli.Do(ctx, put)
	return err
}

func (m *Member) record(ctx context.Context) (string, error) {
	n := m.reg.Describe(ctx)
	n.Name, n.Advertise, n.UpdatedAt = m.reg.Name, m.reg.Advertise, time.Now().UTC()
	b, err := json.Marshal(n)
	if err != nil {
		return "", fmt.Errorf("encoding node record: %w", err)
	}
	return string(b), nil
}

// revoke drops a lease, and with it the record it holds, best effort.
func (m *Member) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), m.revokeTimeout())
	defer cancel()
	_, _ = m.c.cli.Revoke(ctx, id)
}

// run refreshes the record every Refresh until ctx ends.
func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.reg.Refresh)
	defer t.Stop()
	healthy := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := m.refresh(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil && healthy:
			m.c.log.Warn("refreshing this node's cluster record", "node", m.reg.Name, "err", err)
		case err == nil && !healthy:
			m.c.log.Info("this node's cluster record is refreshed again", "node", m.reg.Name)
		}
		healthy = err == nil
	}
}

// refresh renews the lease and rewrites the record, or registers anew
// when etcd has lost the lease.
func (m *Member) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.reg.Refresh)
	defer cancel()
	_, err := m.c.cli.KeepAliveOnce(ctx, m.lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.c.log.Warn("this node's cluster lease expired: registering again", "node", m.reg.Name)
		return m.register(ctx, false)
	}
	if err != nil {
		return fmt.Errorf("renewing lease: %w", err)
	}
	val, err := m.record(ctx)
	if err != nil {
		return err
	}
	if _, err := m.c.cli.Put(ctx, m.key, val, clientv3.WithLease(m.lease)); err != nil {
		return fmt.Errorf("writing node record: %w", err)
	}
	return nil
}

// Stop stops refreshing and removes the node's record by revoking its
// lease; the record is gone from List once Stop returns nil. An error
// means etcd could not be told, and the record then lasts until its TTL.
// Call it once.
func (m *Member) Stop(ctx context.Context) error {
	m.stop()
	<-m.done
	ctx, cancel := context.WithTimeout(ctx, m.revokeTimeout())
	defer cancel()
	if _, err := m.c.cli.Revoke(ctx, m.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("removing node %s from the cluster: %w", m.reg.Name, err)
	}
	return nil
}

// revokeTimeout bounds a lease's revocation: a refresh interval, and at
// least a second, as a revocation has no later attempt.
func (m *Member) revokeTimeout() time.Duration { return max(m.reg.Refresh, time.Second) }

// zapDiscard is the etcd client's logger: the client's own retries are
// not worth a line each, and the member logs what they lead to.
func zapDiscard() *zap.Logger { return zap.NewNop() }
