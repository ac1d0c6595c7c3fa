package server

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

func (s *Server) serviceRoutes() []route {
	return []route{
		{"PUT /v1/templates/{name}/service", s.setTemplateService},
		{"DELETE /v1/templates/{name}/service", s.clearTemplateService},
		{"GET /v1/sandboxes/{id}/service", s.sandboxService},
	}
}

// setTemplateService replaces a template's service (body: a Service).
func (s *Server) setTemplateService(w http.ResponseWriter, r *http.Request) {
	var sv sandbox.Service
	if err := decode(r, &sv); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, err := s.m.SetTemplateService(r.Context(), r.PathValue("name"), &sv)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// clearTemplateService removes a template's service.
func (s *Server) clearTemplateService(w http.ResponseWriter, r *http.Request) {
	t, err := s.m.SetTemplateService(r.Context(), r.PathValue("name"), nil)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// sandboxService describes a sandbox's service (wire.ServiceStatus).
func (s *Server) sandboxService(w http.ResponseWriter, r *http.Request) {
	st, err := s.m.ServiceStatus(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// serviceParams reads the service query parameters of a Dockerfile
// build: start (shell), ready (shell), ready_port, ready_url,
// ready_timeout (seconds, fractional allowed), restart and no_start. It
// returns nil when none but no_start is given; a service without start
// takes the Dockerfile's CMD and ENTRYPOINT.
func serviceParams(q url.Values) (sv *sandbox.Service, noStart bool, err error) {
	if noStart, err = boolParam(q, "no_start"); err != nil {
		return nil, false, err
	}
	var out sandbox.Service
	set := false
	if v := q.Get("start"); v != "" {
		out.Shell, set = v, true
	}
	if v := q.Get("restart"); v != "" {
		out.Restart, set = v, true
	}
	var ready wire.ReadyCheck
	n := 0
	if v := q.Get("ready"); v != "" {
		ready.Shell, n = v, n+1
	}
	if v := q.Get("ready_url"); v != "" {
		ready.URL, n = v, n+1
	}
	if v := q.Get("ready_port"); v != "" {
		p, perr := strconv.Atoi(v)
		if perr != nil || p < 1 || p > 65535 {
			return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter ready_port=%q: want a port from 1 to 65535", v)
		}
		ready.Port, n = p, n+1
	}
	if n > 1 {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameters ready, ready_port and ready_url are exclusive")
	}
	if n == 1 {
		out.Ready, set = &ready, true
	}
	if v := q.Get("ready_timeout"); v != "" {
		secs, perr := strconv.ParseFloat(v, 64)
		if perr != nil || secs < 0 || secs > sandbox.MaxReadyTimeout.Seconds() {
			return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter ready_timeout=%q: want seconds from 0 to %d", v, int(sandbox.MaxReadyTimeout.Seconds()))
		}
		out.ReadyTimeoutMS, set = int64(secs*float64(time.Second/time.Millisecond)), true
	}
	if !set {
		return nil, noStart, nil
	}
	if noStart {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter no_start excludes start, ready, ready_port, ready_url, ready_timeout and restart")
	}
	return &out, false, nil
}
