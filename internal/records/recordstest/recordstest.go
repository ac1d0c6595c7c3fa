// Package recordstest is the conformance suite that every store of
// Corral's records runs from its own tests: for sandboxes, templates,
// pools, snapshots and volumes, a put inserts or replaces by name, a delete is
// idempotent, a listing returns exactly the records put and not deleted,
// and records read back share no maps or slices with the caller. A store
// that is durable also keeps them all across a reopen.
package recordstest

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/sandbox"
)

// Store is what the Manager asks of a store that keeps every kind of
// record.
type Store interface {
	sandbox.Store
	sandbox.PoolStore
	sandbox.SnapshotStore
	sandbox.VolumeStore
}

// Config is what a store's test tells the suite.
type Config struct {
	// New must return a fresh, empty store for each call and arrange its
	// Close with t.Cleanup.
	New func(t *testing.T) Store
	// Reopen opens a second store on s's records, as a restarted daemon
	// does, and arranges its Close. It is nil for a store that keeps
	// nothing across a restart; the reopen case then skips, saying so.
	Reopen func(t *testing.T, s Store) Store
}

// Run runs the suite.
func Run(t *testing.T, c Config) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"Sandboxes", func(t *testing.T, s Store) { testKind(t, func() kind[sandbox.Sandbox] { return sandboxes(s) }) }},
		{"Templates", func(t *testing.T, s Store) { testKind(t, func() kind[sandbox.Template] { return templates(s) }) }},
		{"Pools", func(t *testing.T, s Store) { testKind(t, func() kind[sandbox.Pool] { return pools(s) }) }},
		{"Snapshots", func(t *testing.T, s Store) { testKind(t, func() kind[sandbox.Snapshot] { return snapshots(s) }) }},
		{"Volumes", func(t *testing.T, s Store) { testKind(t, func() kind[sandbox.Volume] { return volumes(s) }) }},
		{"ReopenKeepsRecords", func(t *testing.T, s Store) {
			if c.Reopen == nil {
				t.Skip("the store's test gives no Reopen function: it keeps records in memory only")
			}
			testReopen(t, s, c.Reopen)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, c.New(t)) })
	}
}

// kind is one kind of record as the suite drives it: its store methods,
// how to name a record and how to change one of its maps or slices in
// place, and three sample records (a and b, and a2: a changed).
type kind[V any] struct {
	put    func(context.Context, V) error
	del    func(context.Context, string) error
	list   func(context.Context) ([]V, error)
	key    func(V) string
	mutate func(*V)
	a, b   V
	a2     V
}

var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func sandboxes(s Store) kind[sandbox.Sandbox] {
	a := sandbox.Sandbox{ID: "a", Template: "t", Runtime: "runc", State: sandbox.StateCreating,
		MemoryBytes: 64 << 20, Env: map[string]string{"K": "V"}, Metadata: map[string]string{"m": "1"},
		CreatedAt: created, Deadline: created.Add(time.Minute), Tenant: "team-a", Key: "ci"}
	a2 := a
	a2.State = sandbox.StateRunning
	return kind[sandbox.Sandbox]{
		put: s.PutSandbox, del: s.DeleteSandbox, list: s.Sandboxes,
		key:    func(sb sandbox.Sandbox) string { return sb.ID },
		mutate: func(sb *sandbox.Sandbox) { sb.Env["K"] = "changed" },
		a:      a, a2: a2,
		b: sandbox.Sandbox{ID: "b", Template: "t", Runtime: "runc", State: sandbox.StateRunning, CreatedAt: created,
			Pool: "p", IdleTimeout: 90 * time.Second, OnDeadline: sandbox.ActionPause, OnIdle: sandbox.ActionDestroy},
	}
}

func templates(s Store) kind[sandbox.Template] {
	a := sandbox.Template{Name: "a", Source: "pull", CreatedAt: created, Image: "busybox", BuildKeys: []string{"k1"},
		Defaults: &sandbox.Defaults{Env: []string{"PATH=/bin"}, Labels: map[string]string{"l": "1"}}}
	a2 := a
	a2.Digest = "sha256:00"
	return kind[sandbox.Template]{
		put: s.PutTemplate, del: s.DeleteTemplate, list: s.Templates,
		key:    func(t sandbox.Template) string { return t.Name },
		mutate: func(t *sandbox.Template) { t.BuildKeys[0] = "changed" },
		a:      a, a2: a2,
		b: sandbox.Template{Name: "b", Source: "busybox", CreatedAt: created},
	}
}

func pools(s Store) kind[sandbox.Pool] {
	a := sandbox.Pool{Name: "a", Template: "t", Runtime: "runc", MilliCPUs: 500, MemoryBytes: 64 << 20, Network: egress.ModeNone, Size: 8}
	a2 := a
	a2.Size = 2
	return kind[sandbox.Pool]{
		put: s.PutPool, del: s.DeletePool, list: s.Pools,
		key:    func(p sandbox.Pool) string { return p.Name },
		mutate: func(p *sandbox.Pool) {}, // a pool has no maps or slices
		a:      a, a2: a2,
		b: sandbox.Pool{Name: "b", Template: "t", Runtime: "gvisor", Network: egress.ModeOpen, Size: 1},
	}
}

func snapshots(s Store) kind[sandbox.Snapshot] {
	a := sandbox.Snapshot{Name: "a", Kind: sandbox.SnapshotMemory, SandboxID: "x", Template: "t", Runtime: "gvisor",
		MemoryBytes: 64 << 20, Env: map[string]string{"K": "V"}, Metadata: map[string]string{"m": "1"}, CreatedAt: created, SizeBytes: 42}
	a2 := a
	a2.SizeBytes = 43
	return kind[sandbox.Snapshot]{
		put: s.PutSnapshot, del: s.DeleteSnapshot, list: s.Snapshots,
		key:    func(snap sandbox.Snapshot) string { return snap.Name },
		mutate: func(snap *sandbox.Snapshot) { snap.Metadata["m"] = "changed" },
		a:      a, a2: a2,
		b: sandbox.Snapshot{Name: "b", Kind: sandbox.SnapshotFilesystem, Template: "t", Runtime: "runc", CreatedAt: created},
	}
}

func volumes(s Store) kind[sandbox.Volume] {
	a := sandbox.Volume{Name: "a", SizeBytes: 10 << 30, CreatedAt: created, Labels: map[string]string{"team": "x"}}
	a2 := a
	a2.SizeBytes = 0
	return kind[sandbox.Volume]{
		put: s.PutVolume, del: s.DeleteVolume, list: s.Volumes,
		key:    func(v sandbox.Volume) string { return v.Name },
		mutate: func(v *sandbox.Volume) { v.Labels["team"] = "changed" },
		a:      a, a2: a2,
		b: sandbox.Volume{Name: "b", CreatedAt: created},
	}
}

// listSorted returns k's records ordered by name; the store's order is
// not part of the contract.
func listSorted[V any](t *testing.T, k kind[V]) []V {
	t.Helper()
	got, err := k.list(t.Context())
	if err != nil {
		t.Fatalf("listing: %v", err)
	}
	slices.SortFunc(got, func(x, y V) int { return cmp.Compare(k.key(x), k.key(y)) })
	return got
}

// testKind drives the records newKind returns; it calls newKind again for
// the records it expects, so that a store that kept the caller's maps
// cannot change them too.
func testKind[V any](t *testing.T, newKind func() kind[V]) {
	ctx := t.Context()
	k, want := newKind(), newKind()
	if got := listSorted(t, k); len(got) != 0 {
		t.Fatalf("new store lists %v", got)
	}
	for _, v := range []V{k.a, k.b} {
		if err := k.put(ctx, v); err != nil {
			t.Fatalf("put %s: %v", k.key(v), err)
		}
	}
	if diff := gocmp.Diff([]V{want.a, want.b}, listSorted(t, k)); diff != "" {
		t.Errorf("records after two puts (-want +got):\n%s", diff)
	}
	if err := k.put(ctx, k.a2); err != nil {
		t.Fatalf("replacing %s: %v", k.key(k.a2), err)
	}
	for i := range 2 {
		if err := k.del(ctx, k.key(k.b)); err != nil {
			t.Fatalf("delete #%d of %s: %v", i+1, k.key(k.b), err)
		}
	}
	if err := k.del(ctx, "missing"); err != nil {
		t.Errorf("deleting a missing record: %v", err)
	}
	if diff := gocmp.Diff([]V{want.a2}, listSorted(t, k)); diff != "" {
		t.Errorf("records after replace and delete (-want +got):\n%s", diff)
	}

	// Neither the record put nor the one read back shares its maps and
	// slices with the store.
	put := listSorted(t, k)[0]
	if err := k.put(ctx, put); err != nil {
		t.Fatal(err)
	}
	k.mutate(&put)
	got := listSorted(t, k)
	k.mutate(&got[0])
	if diff := gocmp.Diff([]V{want.a2}, listSorted(t, k)); diff != "" {
		t.Errorf("records after changing copies (-want +got):\n%s", diff)
	}
}

// testReopen checks that a reopened store lists every kind of record as
// it was put.
func testReopen(t *testing.T, s Store, reopen func(*testing.T, Store) Store) {
	sbs, tmpls, ps, snaps, vols := sandboxes(s), templates(s), pools(s), snapshots(s), volumes(s)
	ctx := t.Context()
	for _, err := range []error{
		sbs.put(ctx, sbs.a), sbs.put(ctx, sbs.b),
		tmpls.put(ctx, tmpls.a), tmpls.put(ctx, tmpls.b),
		ps.put(ctx, ps.a), ps.put(ctx, ps.b),
		snaps.put(ctx, snaps.a), snaps.put(ctx, snaps.b),
		vols.put(ctx, vols.a), vols.put(ctx, vols.b),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	s = reopen(t, s)
	sbs, tmpls, ps, snaps, vols = sandboxes(s), templates(s), pools(s), snapshots(s), volumes(s)
	checkList(t, "sandboxes", []sandbox.Sandbox{sbs.a, sbs.b}, sbs)
	checkList(t, "templates", []sandbox.Template{tmpls.a, tmpls.b}, tmpls)
	checkList(t, "pools", []sandbox.Pool{ps.a, ps.b}, ps)
	checkList(t, "snapshots", []sandbox.Snapshot{snaps.a, snaps.b}, snaps)
	checkList(t, "volumes", []sandbox.Volume{vols.a, vols.b}, vols)
}

func checkList[V any](t *testing.T, what string, want []V, k kind[V]) {
	t.Helper()
	if diff := gocmp.Diff(want, listSorted(t, k)); diff != "" {
		t.Errorf("%s after reopen (-want +got):\n%s", what, diff)
	}
}
