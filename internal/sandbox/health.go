package sandbox

import "github.com/corralrun/corral/internal/storage"

// DiskQuota reports the state of the storage backend's disk quota
// accounting; ok is false for a backend that has none to report.
func (m *Manager) DiskQuota() (_ storage.QuotaStatus, ok bool) {
	q, ok := m.cfg.Storage.(storage.QuotaReporter)
	if !ok {
		return storage.QuotaStatus{}, false
	}
	return q.QuotaStatus(), true
}
