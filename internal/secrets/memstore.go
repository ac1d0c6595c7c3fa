package secrets

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
)

// MemStore is Records in memory, for tests. Safe for concurrent use.
type MemStore struct {
	mu   sync.Mutex
	recs map[[2]string]Record
}

var _ Records = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{recs: map[[2]string]Record{}} }

// PutSecret implements Records.
func (m *MemStore) PutSecret(_ context.Context, r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.Ciphertext = slices.Clone(r.Ciphertext)
	m.recs[[2]string{r.Tenant, r.Name}] = r
	return nil
}

// DeleteSecret implements Records.
func (m *MemStore) DeleteSecret(_ context.Context, tenant, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, [2]string{tenant, name})
	return nil
}

// Secret implements Records.
func (m *MemStore) Secret(_ context.Context, tenant, name string) (Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[[2]string{tenant, name}]
	r.Ciphertext = slices.Clone(r.Ciphertext)
	return r, ok, nil
}

// Secrets implements Records.
func (m *MemStore) Secrets(_ context.Context, tenant string) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Record
	for _, k := range slices.SortedFunc(maps.Keys(m.recs), func(a, b [2]string) int { return cmp.Compare(a[1], b[1]) }) {
		if k[0] == tenant {
			r := m.recs[k]
			r.Ciphertext = slices.Clone(r.Ciphertext)
			out = append(out, r)
		}
	}
	return out, nil
}
