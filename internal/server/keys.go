package server

import (
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// KeyRequest is the body of POST /v1/keys.
type KeyRequest struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant,omitempty"`
	Admin  bool   `json:"admin,omitempty"`
	// The tenant's quotas; zero or absent is unlimited.
	MaxSandboxes     int     `json:"max_sandboxes,omitempty"`
	MaxMemoryMB      int64   `json:"max_memory_mb,omitempty"`
	MaxCPUs          float64 `json:"max_cpus,omitempty"`
	MaxDiskMB        int64   `json:"max_disk_mb,omitempty"`
	CreatesPerMinute int     `json:"creates_per_minute,omitempty"`
}

// KeyView is a key as the API shows it: never its secret, which only
// the answers of create and rotate carry, once.
type KeyView struct {
	Name             string    `json:"name"`
	Tenant           string    `json:"tenant"`
	Admin            bool      `json:"admin,omitempty"`
	MaxSandboxes     int       `json:"max_sandboxes,omitempty"`
	MaxMemoryMB      int64     `json:"max_memory_mb,omitempty"`
	MaxCPUs          float64   `json:"max_cpus,omitempty"`
	MaxDiskMB        int64     `json:"max_disk_mb,omitempty"`
	CreatesPerMinute int       `json:"creates_per_minute,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	RotatedAt        time.Time `json:"rotated_at,omitzero"`
	// Key is the secret, in the answers of create and rotate only.
	Key string `json:"key,omitempty"`
}

func keyView(k tenancy.Key, secret string) KeyView {
	q := k.Quota
	return KeyView{Name: k.Name, Tenant: k.Tenant, Admin: k.Admin, MaxSandboxes: q.Sandboxes, MaxMemoryMB: q.MemoryBytes >> 20,
		MaxCPUs: float64(q.MilliCPUs) / 1000, MaxDiskMB: q.DiskBytes >> 20, CreatesPerMinute: q.CreatesPerMinute,
		CreatedAt: k.CreatedAt, RotatedAt: k.RotatedAt, Key: secret}
}

func (s *Server) keyRoutes() []route {
	return []route{
		{"GET /v1/keys", s.listKeys},
		{"POST /v1/keys", s.createKey},
		{"DELETE /v1/keys/{name}", s.deleteKey},
		{"POST /v1/keys/{name}/rotate", s.rotateKey},
	}
}

// keyRecords are the key records, or an error saying the server has
// none.
func (s *Server) keyRecords() (*tenancy.Keys, error) {
	if s.cfg.Keys == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "this server keeps no API key records")
	}
	return s.cfg.Keys, nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	ks, err := s.keyRecords()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, views(ks.List(), func(k tenancy.Key) KeyView { return keyView(k, "") }))
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	ks, err := s.keyRecords()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req KeyRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var q tenancy.Quota
	var sandboxes, rate int64
	var err2 error
	conv := func(dst *int64, rng sandbox.Range, v int64) {
		if err2 == nil {
			*dst, err2 = rng.Convert(v)
		}
	}
	conv(&sandboxes, sandbox.RangeQuotaSandboxes, int64(req.MaxSandboxes))
	conv(&q.MemoryBytes, sandbox.RangeQuotaMemory, req.MaxMemoryMB)
	conv(&q.DiskBytes, sandbox.RangeQuotaDisk, req.MaxDiskMB)
	conv(&rate, sandbox.RangeCreateRate, int64(req.CreatesPerMinute))
	if err2 == nil {
		q.MilliCPUs, err2 = sandbox.RangeQuotaCPUs.ConvertFloat(req.MaxCPUs)
	}
	if err2 != nil {
		s.writeError(w, r, err2)
		return
	}
	q.Sandboxes, q.CreatesPerMinute = int(sandboxes), int(rate)
	k, secret, err := ks.Create(r.Context(), tenancy.KeyOptions{Name: req.Name, Tenant: req.Tenant, Admin: req.Admin, Quota: q})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, keyView(k, secret))
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request) {
	ks, err := s.keyRecords()
	if err == nil {
		err = ks.Delete(r.Context(), r.PathValue("name"))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) rotateKey(w http.ResponseWriter, r *http.Request) {
	ks, err := s.keyRecords()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	k, secret, err := ks.Rotate(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keyView(k, secret))
}
