package sandbox

import (
	"context"
	"sync"
)

// snapStore is a memStore that also keeps snapshot records.
type snapStore struct {
	*memStore
	smu   sync.Mutex
	snaps map[string]Snapshot
}

func newSnapStore() *snapStore {
	return &snapStore{memStore: newMemStore(), snaps: map[string]Snapshot{}}
}

func (s *snapStore) PutSnapshot(_ context.Context, snap Snapshot) error {
	s.smu.Lock()
	defer s.smu.Unlock()
	s.snaps[snap.Name] = snap.clone()
	return nil
}

func (s *snapStore) DeleteSnapshot(_ context.Context, name string) error {
	s.smu.Lock()
	defer s.smu.Unlock()
	delete(s.snaps, name)
	return nil
}

func (s *snapStore) Snapshots(context.Context) ([]Snapshot, error) {
	s.smu.Lock()
	defer s.smu.Unlock()
	var out []Snapshot
	for _, snap := range s.snaps {
		out = append(out, snap.clone())
	}
	return out, nil
}
