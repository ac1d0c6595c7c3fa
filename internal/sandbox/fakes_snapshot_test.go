package sandbox

import "github.com/corralrun/corral/internal/records/memstore"

// snapStore is a memStore that also keeps snapshot records.
type snapStore struct {
	*memStore
	*memstore.SnapshotStore[Snapshot]
}

// withSnapshots returns s keeping snapshot records too.
func withSnapshots(s *memStore) *snapStore {
	return &snapStore{memStore: s, SnapshotStore: memstore.NewSnapshotStore(
		memstore.Kind[Snapshot]{Key: func(snap Snapshot) string { return snap.Name }, Clone: Snapshot.clone})}
}
