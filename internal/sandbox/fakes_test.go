package sandbox

import (
	"context"
	"sync"

	"github.com/corralrun/corral/internal/records/memstore"
	"github.com/corralrun/corral/internal/storage"
)

// memStore is the in-memory Store of package memstore; failPut makes
// PutSandbox fail for tests of rollback paths.
type memStore struct {
	*memstore.Store[Sandbox, Template, Pool]
	*memstore.VolumeStore[Volume]
	mu      sync.Mutex
	failPut func(Sandbox) error
}

func newMemStore() *memStore {
	return &memStore{Store: memstore.New(
		memstore.Kind[Sandbox]{Key: func(sb Sandbox) string { return sb.ID }, Clone: Sandbox.clone},
		memstore.Kind[Template]{Key: func(t Template) string { return t.Name }, Clone: Template.clone},
		memstore.Kind[Pool]{Key: func(p Pool) string { return p.Name }, Clone: func(p Pool) Pool { return p }},
	), VolumeStore: memstore.NewVolumeStore(memstore.Kind[Volume]{Key: func(v Volume) string { return v.Name }, Clone: Volume.clone})}
}

// sandbox returns the record of id (zero when there is none).
func (s *memStore) sandbox(id string) Sandbox {
	sb, _ := s.Sandbox(id)
	return sb
}

func (s *memStore) PutSandbox(ctx context.Context, sb Sandbox) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut != nil {
		if err := s.failPut(sb); err != nil {
			return err
		}
	}
	return s.Store.PutSandbox(ctx, sb)
}

func storageOpts() storage.RootOptions { return storage.RootOptions{} }
