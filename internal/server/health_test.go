package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/storage"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
)

// quotaStorage is the fake storage with disk quota accounting whose state
// the test sets.
type quotaStorage struct {
	*storagefake.Backend
	mu     sync.Mutex
	status storage.QuotaStatus
}

func (q *quotaStorage) QuotaStatus() storage.QuotaStatus {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.status
}

func (q *quotaStorage) set(s storage.QuotaStatus) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.status = s
}

func TestHealthReportsDiskQuota(t *testing.T) {
	qs := &quotaStorage{status: storage.QuotaStatus{Enabled: true, Mode: "simple", Consistent: true}}
	_, ts := newTestServer(t, "", func(c *sandbox.Config) {
		qs.Backend = c.Storage.(*storagefake.Backend)
		c.Storage = qs
	})
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s, %v", path, resp.StatusCode, body, err)
		}
		return string(body)
	}
	health := func() Health {
		t.Helper()
		var h Health
		if err := json.Unmarshal([]byte(get("/v1/health")), &h); err != nil {
			t.Fatal(err)
		}
		return h
	}

	good := qs.QuotaStatus()
	if diff := cmp.Diff(Health{OK: true, DiskQuota: &good}, health()); diff != "" {
		t.Errorf("health while consistent (-want +got):\n%s", diff)
	}
	if m := get("/metrics"); !strings.Contains(m, "corral_disk_quota_consistent 1\n") {
		t.Errorf("metrics while consistent lack corral_disk_quota_consistent 1:\n%s", m)
	}

	qs.set(storage.QuotaStatus{Enabled: true, Mode: "full", Repairing: true, Inconsistencies: 2})
	h := health()
	if h.OK || len(h.Problems) != 1 || !strings.Contains(h.Problems[0], "disk limits are not enforced") {
		t.Errorf("health while inconsistent: %+v, want not ok with the reason", h)
	}
	m := get("/metrics")
	for _, want := range []string{"corral_disk_quota_consistent 0\n", "corral_disk_quota_inconsistencies_total 2\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics while inconsistent lack %q", want)
		}
	}
}
