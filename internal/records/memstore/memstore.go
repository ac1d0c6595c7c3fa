// Package memstore keeps Corral's records in memory, with the contract of
// package records (sandbox.Store, sandbox.PoolStore and
// sandbox.SnapshotStore) and none of its durability: it is for tests of
// the layers above the store.
//
// The store is generic over the record types, and is told how to key and
// copy each of them, so that the sandbox package's own tests can use it:
// a store that imported package sandbox could not be imported by them.
package memstore

import (
	"context"
	"maps"
	"slices"
	"sync"
)

// Kind says how the store keys and copies one kind of record. Clone
// returns a copy that shares no maps or slices with its argument, so that
// callers cannot change a stored record behind the store's back.
type Kind[V any] struct {
	Key   func(V) string
	Clone func(V) V
}

// Table holds the records of one kind by key. Safe for concurrent use.
type Table[V any] struct {
	kind Kind[V]
	mu   sync.Mutex
	rows map[string]V
}

// NewTable returns an empty table of records of kind k.
func NewTable[V any](k Kind[V]) *Table[V] {
	return &Table[V]{kind: k, rows: map[string]V{}}
}

// Put inserts or replaces the record with v's key.
func (t *Table[V]) Put(v V) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rows[t.kind.Key(v)] = t.kind.Clone(v)
}

// Get returns a copy of the record with key and whether there is one.
func (t *Table[V]) Get(key string) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.rows[key]
	if !ok {
		return v, false
	}
	return t.kind.Clone(v), true
}

// Delete removes the record with key; a missing record is not an error.
func (t *Table[V]) Delete(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.rows, key)
}

// List returns copies of every record, ordered by key as package records
// orders them.
func (t *Table[V]) List() []V {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []V
	for _, k := range slices.Sorted(maps.Keys(t.rows)) {
		out = append(out, t.kind.Clone(t.rows[k]))
	}
	return out
}

// Store is an in-memory sandbox.Store and sandbox.PoolStore over the
// record types SB (sandboxes), T (templates) and P (pools). It keeps no
// snapshots, because a Store that keeps them turns snapshots on in the
// Manager; SnapshotStore adds them. Safe for concurrent use.
type Store[SB, T, P any] struct {
	sandboxes *Table[SB]
	templates *Table[T]
	pools     *Table[P]
}

// New returns an empty store of records of the given kinds.
func New[SB, T, P any](sandboxes Kind[SB], templates Kind[T], pools Kind[P]) *Store[SB, T, P] {
	return &Store[SB, T, P]{
		sandboxes: NewTable(sandboxes),
		templates: NewTable(templates),
		pools:     NewTable(pools),
	}
}

// Sandbox returns a copy of sandbox id's record and whether there is one.
func (s *Store[SB, T, P]) Sandbox(id string) (SB, bool) { return s.sandboxes.Get(id) }

// PutSandbox inserts or replaces a sandbox record.
func (s *Store[SB, T, P]) PutSandbox(_ context.Context, sb SB) error {
	s.sandboxes.Put(sb)
	return nil
}

// DeleteSandbox removes a sandbox record; a missing record is not an error.
func (s *Store[SB, T, P]) DeleteSandbox(_ context.Context, id string) error {
	s.sandboxes.Delete(id)
	return nil
}

// Sandboxes returns every sandbox record.
func (s *Store[SB, T, P]) Sandboxes(context.Context) ([]SB, error) { return s.sandboxes.List(), nil }

// PutTemplate inserts or replaces a template record.
func (s *Store[SB, T, P]) PutTemplate(_ context.Context, t T) error {
	s.templates.Put(t)
	return nil
}

// DeleteTemplate removes a template record; a missing record is not an
// error.
func (s *Store[SB, T, P]) DeleteTemplate(_ context.Context, name string) error {
	s.templates.Delete(name)
	return nil
}

// Templates returns every template record.
func (s *Store[SB, T, P]) Templates(context.Context) ([]T, error) { return s.templates.List(), nil }

// PutPool inserts or replaces a pool definition.
func (s *Store[SB, T, P]) PutPool(_ context.Context, p P) error {
	s.pools.Put(p)
	return nil
}

// DeletePool removes a pool definition; a missing one is not an error.
func (s *Store[SB, T, P]) DeletePool(_ context.Context, name string) error {
	s.pools.Delete(name)
	return nil
}

// Pools returns every pool definition.
func (s *Store[SB, T, P]) Pools(context.Context) ([]P, error) { return s.pools.List(), nil }

// SnapshotStore is an in-memory sandbox.SnapshotStore over the snapshot
// record type S; embedded next to a Store, it turns snapshots on. Safe
// for concurrent use.
type SnapshotStore[S any] struct {
	snapshots *Table[S]
}

// NewSnapshotStore returns an empty snapshot store of records of kind k.
func NewSnapshotStore[S any](k Kind[S]) *SnapshotStore[S] {
	return &SnapshotStore[S]{snapshots: NewTable(k)}
}

// PutSnapshot inserts or replaces a snapshot record.
func (s *SnapshotStore[S]) PutSnapshot(_ context.Context, snap S) error {
	s.snapshots.Put(snap)
	return nil
}

// DeleteSnapshot removes a snapshot record; a missing record is not an
// error.
func (s *SnapshotStore[S]) DeleteSnapshot(_ context.Context, name string) error {
	s.snapshots.Delete(name)
	return nil
}

// Snapshots returns every snapshot record.
func (s *SnapshotStore[S]) Snapshots(context.Context) ([]S, error) { return s.snapshots.List(), nil }

// VolumeStore is an in-memory sandbox.VolumeStore over the volume record
// type V; embedded next to a Store, it turns volumes on. Safe for
// concurrent use.
type VolumeStore[V any] struct {
	volumes *Table[V]
}

// NewVolumeStore returns an empty volume store of records of kind k.
func NewVolumeStore[V any](k Kind[V]) *VolumeStore[V] {
	return &VolumeStore[V]{volumes: NewTable(k)}
}

// PutVolume inserts or replaces a volume record.
func (s *VolumeStore[V]) PutVolume(_ context.Context, v V) error {
	s.volumes.Put(v)
	return nil
}

// DeleteVolume removes a volume record; a missing record is not an error.
func (s *VolumeStore[V]) DeleteVolume(_ context.Context, name string) error {
	s.volumes.Delete(name)
	return nil
}

// Volumes returns every volume record.
func (s *VolumeStore[V]) Volumes(context.Context) ([]V, error) { return s.volumes.List(), nil }
