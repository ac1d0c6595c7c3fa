package server

import (
	"net/http"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
)

// TenantHeader lets an admin key (or the unix socket) act for a tenant:
// what the request creates belongs to that tenant. Other keys may not
// send it.
const TenantHeader = "X-Corral-Tenant"

// adminRoutes change what every tenant shares (pools, and the ready
// snapshots of templates, which hold memory of the host's) or read across
// tenants (keys, the audit log, the cluster's nodes): admin keys only. A tenant makes, changes
// and deletes its own templates (the Manager checks whose a template is);
// /metrics shows a tenant its own sandboxes (metrics.go).
var adminRoutes = map[string]bool{
	"POST /v1/templates/{name}/ready-snapshot":   true,
	"DELETE /v1/templates/{name}/ready-snapshot": true,
	"PUT /v1/pools/{name}":                       true,
	"DELETE /v1/pools/{name}":                    true,
	"GET /v1/keys":                               true,
	"POST /v1/keys":                              true,
	"DELETE /v1/keys/{name}":                     true,
	"POST /v1/keys/{name}/rotate":                true,
	"GET /v1/audit":                              true,
	"GET /v1/nodes":                              true,
}

// adminOnly refuses h to callers that are not admins, with 403.
func adminOnly(s *Server, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p, ok := tenancy.From(r.Context()); ok && !p.Admin {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrPermissionDenied, "%s %s needs an admin key", r.Method, r.URL.Path))
			return
		}
		h(w, r)
	}
}

// withOperator marks requests on the root-only unix socket: the
// operator, an admin, one principal for admission.
func (s *Server) withOperator(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := actingFor(r, tenancy.Operator)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		ctx := admission.WithPrincipal(tenancy.With(r.Context(), p), unixPrincipal)
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// actingFor applies the TenantHeader of an admin's request.
func actingFor(r *http.Request, p tenancy.Principal) (tenancy.Principal, error) {
	t := r.Header.Get(TenantHeader)
	if t == "" {
		return p, nil
	}
	if !p.Admin {
		return p, errdefs.Errorf(errdefs.ErrPermissionDenied, "only admin keys may send %s", TenantHeader)
	}
	if err := tenancy.CheckName("tenant", t); err != nil {
		return p, err
	}
	p.Tenant = t
	return p, nil
}

// requireKey serves h to requests with a valid key, as the key's
// principal. A request of a key that is deleted or rotated while it runs
// (a stream, an attach, a port proxy) ends within moments: its context is
// cancelled.
func (s *Server) requireKey(keys *tenancy.Keys, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := RequestKey(r.Header)
		p, err := keys.Authenticate(secret)
		if err == nil {
			p, err = actingFor(r, p)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		ctx, stop := keys.Watch(tenancy.With(r.Context(), p), secret)
		defer stop()
		ctx = admission.WithPrincipal(ctx, admissionPrincipal(p, secret))
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// admissionPrincipal is the principal of per-key limits (--max-per-key):
// the key. The --api-key key keeps the digest it had before keys were
// records, so that its sandboxes' claims survive an upgrade.
func admissionPrincipal(p tenancy.Principal, secret string) string {
	if p.Key == tenancy.BootstrapName {
		return admission.APIKeyPrincipal(secret)
	}
	return "key:" + p.Key
}
