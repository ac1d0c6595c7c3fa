package testutil

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that several goroutines may write and read
// at once: the stdout and stderr of a process the test reads while it runs.
// The zero value is ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns a copy of everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
