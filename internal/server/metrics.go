package server

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// scrapeTimeout bounds the families computed on scrape (per-sandbox usage
// read from the drivers), so a slow runtime cannot hang a scraper.
const scrapeTimeout = 5 * time.Second

// metrics serves the registry in the Prometheus text format: all of it to
// admins, and to a tenant's key the families of its own sandboxes
// (sandbox.TenantMetrics), counted over its sandboxes only. It is written
// to a buffer first, so a scrape that fails halfway answers 500 instead of
// a truncated page.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), scrapeTimeout)
	defer cancel()
	var families []string // all
	if p, ok := tenancy.From(ctx); ok && !p.Admin {
		families = sandbox.TenantMetrics()
	}
	var buf bytes.Buffer
	if err := s.reg.WriteFamilies(ctx, &buf, families); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", metrics.ContentType)
	_, _ = w.Write(buf.Bytes())
}

// unixPrincipal is everyone on the root-only unix socket, one principal
// for the Manager's per-principal limits; each API key is another
// (admission.APIKeyPrincipal).
const unixPrincipal = "unix"
