package e2b

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// This file serves E2B's sandbox metrics from Corral's usage samples.

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int64     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metricOf reads one sample now. Corral keeps no history: CPU use is the
// average since the sandbox started, and disk use is not measured.
func (s *Server) metricOf(ctx context.Context, id string) (metric, error) {
	sb, err := s.m.Get(ctx, id)
	if err != nil {
		return metric{}, err
	}
	st, err := s.m.Stats(ctx, id)
	if err != nil {
		return metric{}, err
	}
	now := time.Now().UTC()
	cpus := max(1, (sb.MilliCPUs+999)/1000)
	pct := 0.0
	if el := now.Sub(sb.CreatedAt); el > 0 && sb.MilliCPUs > 0 {
		pct = 100 * float64(st.CPUUsageNanos) / (float64(el.Nanoseconds()) * float64(sb.MilliCPUs) / 1000)
	}
	return metric{Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus, CPUUsedPct: pct,
		MemUsed: st.MemoryBytes, MemTotal: sb.MemoryBytes, DiskTotal: sb.DiskBytes}, nil
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.metricOf(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, []metric{m})
}

// metricsOfMany answers GET /sandboxes/metrics?sandbox_ids=a,b; sandboxes
// that are gone are left out.
func (s *Server) metricsOfMany(w http.ResponseWriter, r *http.Request) {
	out := map[string]metric{}
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if m, err := s.metricOf(r.Context(), id); err == nil {
				out[id] = m
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}
