package mounts

import (
	"context"
	"path/filepath"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/sandbox"
)

var _ sandbox.MountDetacher = (*Mounter)(nil)

// Detach implements sandbox.MountDetacher: a stopped sandbox's mounts go,
// and a later Prepare of the same mounts finds the copy-on-write layers
// again, with the changes the sandbox made before it stopped.
func (m *Mounter) Detach(_ context.Context, id string) error {
	if !driver.ValidID(id) {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.detach(id)
}

// release detaches sandbox id's mounts and removes its copy-on-write
// layers, which are the daemon's own files, no mount.
func (m *Mounter) release(id string) error {
	if err := m.detach(id); err != nil {
		return err
	}
	return removeLayers(filepath.Join(m.cfg.StateDir, id))
}
