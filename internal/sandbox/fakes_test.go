package sandbox

import (
	"context"
	"sync"

	"github.com/corralrun/corral/internal/storage"
)

// memStore is an in-memory Store; failPut makes PutSandbox fail for tests
// of rollback paths.
type memStore struct {
	mu        sync.Mutex
	sandboxes map[string]Sandbox
	templates map[string]Template
	pools     map[string]Pool
	failPut   func(Sandbox) error
}

func newMemStore() *memStore {
	return &memStore{sandboxes: map[string]Sandbox{}, templates: map[string]Template{}}
}

// sandbox returns the record of id (zero when there is none).
func (s *memStore) sandbox(id string) Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

func (s *memStore) PutSandbox(_ context.Context, sb Sandbox) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut != nil {
		if err := s.failPut(sb); err != nil {
			return err
		}
	}
	s.sandboxes[sb.ID] = sb.clone()
	return nil
}

func (s *memStore) DeleteSandbox(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sandboxes, id)
	return nil
}

func (s *memStore) Sandboxes(context.Context) ([]Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sandbox
	for _, sb := range s.sandboxes {
		out = append(out, sb.clone())
	}
	return out, nil
}

func (s *memStore) PutTemplate(_ context.Context, t Template) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.templates[t.Name] = t
	return nil
}

func (s *memStore) DeleteTemplate(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.templates, name)
	return nil
}

func (s *memStore) Templates(context.Context) ([]Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Template
	for _, t := range s.templates {
		out = append(out, t)
	}
	return out, nil
}

func storageOpts() storage.RootOptions { return storage.RootOptions{} }
