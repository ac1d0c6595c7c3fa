package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// This file serves E2B's control-plane REST API (E2B's spec/openapi.yml):
// the sandbox lifecycle, mapped onto the Manager. Templates are Corral
// templates addressed by name.

// noDeadline is what endAt says for a sandbox without deadline (E2B has
// no such sandboxes, and the SDKs parse endAt as a date).
func noDeadline() time.Time { return time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC) }

// pauser is the Manager's pause ability (sandbox.Manager has it). The
// facade checks for it so that it builds on a Manager without it, where
// pause answers "not supported".
type pauser interface {
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, id string) (sandbox.Sandbox, error)
}

func (s *Server) routeControl() {
	mux := s.control
	s.handle("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.handle("POST /sandboxes", s.create)
	s.handle("POST /v2/sandboxes", s.create)
	s.handle("GET /sandboxes", s.listRunning)
	s.handle("GET /v2/sandboxes", s.list)
	s.handle("GET /sandboxes/metrics", s.metricsOfMany)
	s.handle("GET /sandboxes/{id}", s.get)
	s.handle("DELETE /sandboxes/{id}", s.kill)
	s.handle("POST /sandboxes/{id}/timeout", s.setTimeout)
	s.handle("POST /sandboxes/{id}/refreshes", s.refresh)
	s.handle("GET /sandboxes/{id}/metrics", s.metrics)
	s.handle("POST /sandboxes/{id}/pause", s.pause)
	s.handle("POST /sandboxes/{id}/resume", s.resume)
	s.handle("POST /sandboxes/{id}/connect", s.connect)
	s.handle("POST /v2/sandboxes/{id}/connect", s.connect)
	s.handle("GET /snapshots", s.listSnapshots)
	s.handle("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	s.handle("POST /sandboxes/{id}/fork", s.fork)
	s.handle("PUT /sandboxes/{id}/network", s.updateNetwork)
	s.handle("DELETE /templates/{id}", s.deleteTemplate)
	s.handle("GET /templates", s.templates)
	s.handle("GET /templates/aliases/{alias}", s.templateAlias)
	s.routeVolumes()
	s.routeTemplateBuilds()

	unsupported := map[string]string{
		"GET /sandboxes/{id}/logs":    "sandbox logs are not kept by Corral",
		"GET /v2/sandboxes/{id}/logs": "sandbox logs are not kept by Corral",
		"GET /teams/{id}/metrics":     "team metrics are not kept by Corral",
		"POST /templates":             "this template-build API is not supported: use an e2b SDK of version 2 or later (Template.build), or `corral template build`",
		"POST /v2/templates":          "this template-build API is not supported: use an e2b SDK of version 2 or later (Template.build), or `corral template build`",
		"/templates/{id}/":            "managing templates through the E2B API is not supported: use `corral template`",
		"/v2/templates/":              "managing templates through the E2B API is not supported: use `corral template`",
		"GET /templates/{id}":         "managing templates through the E2B API is not supported: use `corral template`",
		"/secrets":                    "secrets are not supported by Corral's E2B API",
		"/secrets/":                   "secrets are not supported by Corral's E2B API",
	}
	for pattern, msg := range unsupported {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "%s", msg))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no E2B API route for %s %s", r.Method, r.URL.Path))
	})
}

// newSandbox is E2B's NewSandbox body.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *networkConfig          `json:"network"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	MCP                 json.RawMessage         `json:"mcp"`
	VolumeMounts        []volumeMountInfo       `json:"volumeMounts"`
	IAM                 json.RawMessage         `json:"iam"`
}

// networkConfig is E2B's SandboxNetworkConfig.
type networkConfig struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// Rules are E2B's per-host rules: host -> [{"transform": {"headers":
	// {NAME: VALUE}}}]. Each rule is decoded by headerRules, strictly.
	Rules           map[string][]json.RawMessage `json:"rules"`
	EgressProxy     json.RawMessage              `json:"egressProxy"`
	MaskRequestHost string                       `json:"maskRequestHost"`
}

// networkRule is one of E2B's SandboxNetworkRule: headers its egress
// proxy sets on requests to the rule's host.
type networkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// headerRules maps E2B's per-host rules onto Corral's header rules, in a
// stable order (by host, then header). A value may name the tenant's
// secrets as {{secret:NAME}}, as on Corral's own API. A rule with
// anything but transform.headers is refused rather than half applied.
func (n *networkConfig) headerRules() ([]egress.HeaderRule, error) {
	if n == nil {
		return nil, nil
	}
	var out []egress.HeaderRule
	for _, host := range slices.Sorted(maps.Keys(n.Rules)) {
		for _, raw := range n.Rules[host] {
			var r networkRule
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil || r.Transform == nil {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument,
					"network.rules[%q]: only rules of the form {\"transform\": {\"headers\": {NAME: VALUE}}} are supported by Corral", host)
			}
			for _, name := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
				out = append(out, egress.HeaderRule{Domain: host, Name: name, Value: r.Transform.Headers[name]})
			}
		}
	}
	return out, nil
}

// check refuses the options Corral cannot honor, naming the limit, rather
// than create a sandbox that differs from what was asked. Accepted
// without effect: secure (envd always needs the access token),
// allowPublicTraffic and httpsPorts (ports are reached with a credential
// through the daemon).
func (n newSandbox) check() error {
	notSupported := func(what, why string) error {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s is not supported by Corral: %s", what, why)
	}
	switch {
	case n.TemplateID == "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "templateID is required: name a Corral template")
	case n.AutoResume != nil && n.AutoResume.Enabled:
		return notSupported("autoResume", "a paused sandbox is resumed by connecting to it (Sandbox.connect), not by traffic")
	case n.Network != nil && len(n.Network.EgressProxy) > 0 && string(n.Network.EgressProxy) != "null":
		return notSupported("network.egressProxy", "egress goes through Corral's own filtering proxy")
	case n.Network != nil && n.Network.MaskRequestHost != "":
		return notSupported("network.maskRequestHost", "requests to sandbox ports keep their Host header")
	case len(n.MCP) > 0 && string(n.MCP) != "null":
		return notSupported("mcp", "there is no MCP gateway in Corral templates")
	case len(n.IAM) > 0 && string(n.IAM) != "null":
		return notSupported("iam", "Corral issues no workload identity tokens")
	}
	return nil
}

// policy maps E2B's network options onto a Corral policy; ok is false
// when the request leaves the network to the server's default.
// allowInternetAccess true is mode open, false mode none. allowOut lists
// what the sandbox may reach (IPv4 addresses, CIDRs, domains with an
// optional "*." prefix) and becomes an allowlist; denyOut may only deny
// everything (0.0.0.0/0), which the allowlist does already: Corral cannot
// subtract single ranges from open internet access. rules become header
// rules and, as in E2B ("registering a host here does not allow egress on
// its own"), allow nothing: without other options the mode is the
// server's default (or, in an update, the sandbox's).
func (n newSandbox) policy() (p egress.Policy, ok bool, err error) {
	headers, err := n.Network.headerRules()
	if err != nil {
		return p, false, err
	}
	p, ok, err = n.accessPolicy()
	if err != nil || len(headers) == 0 {
		return p, ok, err
	}
	p.Headers = headers
	return p, true, nil
}

// accessPolicy is the part of policy that says what the sandbox may
// reach.
func (n newSandbox) accessPolicy() (p egress.Policy, ok bool, err error) {
	var allow, deny []string
	if n.Network != nil {
		allow, deny = n.Network.AllowOut, n.Network.DenyOut
	}
	for _, d := range deny {
		if d != "0.0.0.0/0" {
			return p, false, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"network.denyOut %q is not supported by Corral: only 0.0.0.0/0 (deny all but allowOut); name what the sandbox may reach in allowOut", d)
		}
	}
	switch {
	case len(allow) > 0:
		if n.AllowInternetAccess != nil && *n.AllowInternetAccess && len(deny) == 0 {
			return p, false, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"network.allowOut with allowInternetAccess true is not supported by Corral: an allowOut list allows only what it names")
		}
		p.Mode = egress.ModeAllowlist
		for _, a := range allow {
			if pre, err := netip.ParsePrefix(a); err == nil {
				p.CIDRs = append(p.CIDRs, egress.CIDRRule{Prefix: pre})
			} else if addr, err := netip.ParseAddr(a); err == nil {
				p.CIDRs = append(p.CIDRs, egress.CIDRRule{Prefix: netip.PrefixFrom(addr, addr.BitLen())})
			} else {
				p.Domains = append(p.Domains, egress.DomainRule{Name: a})
			}
		}
		return p, true, nil
	case len(deny) > 0 || (n.AllowInternetAccess != nil && !*n.AllowInternetAccess):
		return egress.Policy{Mode: egress.ModeNone}, true, nil
	case n.AllowInternetAccess != nil && *n.AllowInternetAccess:
		return egress.Policy{Mode: egress.ModeOpen}, true, nil
	}
	return p, false, nil
}

// sandboxInfo is E2B's Sandbox (create, connect, resume) and, with the
// detail fields, SandboxDetail (get) and ListedSandbox (list).
type sandboxInfo struct {
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain,omitempty"`
	*sandboxDetail
}

type sandboxDetail struct {
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int64             `json:"cpuCount"`
	MemoryMB     int64             `json:"memoryMB"`
	DiskSizeMB   int64             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	Lifecycle    *lifecycle        `json:"lifecycle,omitempty"`
	VolumeMounts []volumeMountInfo `json:"volumeMounts"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// info describes sb; token adds the envd access token, detail the fields
// of SandboxDetail and ListedSandbox.
func (s *Server) info(sb sandbox.Sandbox, token, detail bool) sandboxInfo {
	out := sandboxInfo{TemplateID: sb.Template, Alias: sb.Template, SandboxID: sb.ID, ClientID: "corral", EnvdVersion: envdVersion}
	if token {
		out.EnvdAccessToken = s.accessToken(sb.ID)
		// The same token opens the sandbox's other ports (servePort):
		// clients such as @e2b/code-interpreter send it on every call as
		// E2B-Traffic-Access-Token, and only some calls carry the envd one.
		tok := out.EnvdAccessToken
		out.TrafficAccessToken = &tok
		if s.cfg.Domain != "" {
			d := s.cfg.Domain
			out.Domain = &d
		}
	}
	if detail {
		end := sb.Deadline
		if end.IsZero() {
			end = noDeadline()
		}
		md := sb.Metadata
		if md == nil {
			md = map[string]string{}
		}
		out.sandboxDetail = &sandboxDetail{
			StartedAt:    sb.CreatedAt,
			EndAt:        end,
			CPUCount:     max(1, (sb.MilliCPUs+999)/1000),
			MemoryMB:     sb.MemoryBytes >> 20,
			DiskSizeMB:   sb.DiskBytes >> 20,
			Metadata:     md,
			State:        sb.State.String(),
			VolumeMounts: volumeMountsOf(sb.Mounts),
		}
		if token {
			out.Lifecycle = &lifecycle{OnTimeout: "kill"}
			if sb.OnDeadline == sandbox.ActionPause {
				out.Lifecycle.OnTimeout = "pause"
			}
		}
	}
	return out
}

// decodeBody reads an optional JSON body leniently: E2B clients send
// fields Corral does not know, and those are ignored.
func decodeBody(r *http.Request, v any) error {
	err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20)).Decode(v)
	if err != nil && !errors.Is(err, io.EOF) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON body: %v", err)
	}
	return nil
}

// seconds converts a timeout in seconds, checked against the range of
// Corral's timeouts (sandbox.RangeTimeout); nil stays nil.
func seconds(v *int64) (*time.Duration, error) {
	if v == nil {
		return nil, nil
	}
	n, err := sandbox.RangeTimeout.Convert(*v)
	if err != nil {
		return nil, err
	}
	d := time.Duration(n)
	return &d, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if err := req.check(); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	mounts, err := req.mounts(s.vols != nil)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	spec := sandbox.Spec{Template: s.resolveTemplate(req.TemplateID), Env: req.EnvVars, Metadata: req.Metadata, Mounts: mounts}
	if _, err := s.m.Template(r.Context(), spec.Template); err != nil {
		// E2B starts a sandbox from a snapshot by naming it as the template.
		if _, serr := s.m.GetSnapshot(r.Context(), req.TemplateID); serr == nil {
			spec.Template, spec.FromSnapshot = "", req.TemplateID
		}
	}
	if p, ok, err := req.policy(); err != nil {
		s.writeAPIError(w, r, err)
		return
	} else if ok {
		spec.Network = p
	}
	if req.AutoPause != nil && *req.AutoPause {
		spec.OnDeadline = sandbox.ActionPause // lifecycle.onTimeout "pause"
	}
	// Corral reads 0 as "no deadline" (allowed when the server has no
	// maximum); E2B has no such value.
	timeout, err := seconds(req.Timeout)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	spec.Timeout = timeout
	sb, err := s.m.Create(r.Context(), spec)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b sandbox created", "sandbox_id", sb.ID, "template", sb.Template)
	writeJSON(w, http.StatusCreated, s.info(sb, true, false))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.info(sb, true, true))
}

// listRunning is the v1 list: running sandboxes, filtered by metadata.
func (s *Server) listRunning(w http.ResponseWriter, r *http.Request) {
	md, err := metadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := []sandboxInfo{}
	for _, sb := range s.m.List(r.Context(), sandbox.Filter{State: sandbox.StateRunning, Metadata: md}) {
		out = append(out, s.info(sb, false, true))
	}
	writeJSON(w, http.StatusOK, out)
}

// list is the v2 list: filters by state (comma-separated), metadata,
// template and start time, ordered by start time, paginated with limit
// (at most 100) and an opaque nextToken answered in x-next-token.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	md, err := metadataQuery(q.Get("metadata"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	var states []sandbox.State
	for _, v := range q["state"] {
		for _, name := range strings.Split(v, ",") {
			st, err := sandbox.ParseState(strings.TrimSpace(name))
			if err != nil {
				s.writeAPIError(w, r, err)
				return
			}
			states = append(states, st)
		}
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339, v); err != nil {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid startedAfter %q: want RFC 3339", v))
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid limit %q: want 1 to 100", v))
			return
		}
	}
	all := s.m.List(r.Context(), sandbox.Filter{Metadata: md})
	if q.Get("order") == "desc" {
		slices.Reverse(all)
	}
	var match []sandbox.Sandbox
	for _, sb := range all {
		if (len(states) == 0 || slices.Contains(states, sb.State)) &&
			(q.Get("template") == "" || q.Get("template") == sb.Template) &&
			(after.IsZero() || sb.CreatedAt.After(after)) {
			match = append(match, sb)
		}
	}
	if tok := q.Get("nextToken"); tok != "" {
		i := slices.IndexFunc(match, func(sb sandbox.Sandbox) bool { return sb.ID == tok })
		if i < 0 {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid nextToken %q: the sandbox it names is gone; list again from the start", tok))
			return
		}
		match = match[i+1:]
	}
	if len(match) > limit {
		w.Header().Set("X-Next-Token", match[limit-1].ID)
		match = match[:limit]
	}
	out := []sandboxInfo{}
	for _, sb := range match {
		out = append(out, s.info(sb, false, true))
	}
	writeJSON(w, http.StatusOK, out)
}

// metadataQuery parses E2B's metadata filter: a query string
// ("user=abc&app=prod") whose keys and values are URL-encoded once more.
func metadataQuery(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(v)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid metadata filter %q: %v", v, err)
	}
	out := make(map[string]string, len(vals))
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[0])
		if err1 != nil || err2 != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid metadata filter %q: bad escape", v)
		}
		out[key] = val
	}
	return out, nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.m.Delete(r.Context(), id); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b sandbox killed", "sandbox_id", id)
	w.WriteHeader(http.StatusNoContent)
}

// templateInfo is E2B's Template, for Corral templates.
type templateInfo struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int64      `json:"cpuCount"`
	MemoryMB      int64      `json:"memoryMB"`
	DiskSizeMB    int64      `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int64      `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

// templates lists the templates the caller's team sees: the operator's
// and its own.
func (s *Server) templates(w http.ResponseWriter, r *http.Request) {
	out := []templateInfo{}
	for _, t := range s.m.Templates(r.Context()) {
		out = append(out, templateInfo{TemplateID: t.Name, BuildID: t.Name, CPUCount: 1, Aliases: []string{t.Name},
			Names: []string{t.Name}, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, BuildCount: 1,
			EnvdVersion: envdVersion, BuildStatus: "ready"})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	if _, err := s.m.Template(r.Context(), s.resolveTemplate(alias)); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	name, _, _ := strings.Cut(alias, ":")
	writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
}

// updateNetwork is PUT /sandboxes/{id}/network: the network options of a
// create (allow_internet_access, allowOut, denyOut; see policy) applied to
// a running sandbox, live. A change to or from no network at all is
// refused, as on Corral's own API: such a sandbox has no interface to open.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		AllowInternetAccess *bool `json:"allow_internet_access"`
		networkConfig
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	n := newSandbox{TemplateID: "-", AllowInternetAccess: req.AllowInternetAccess, Network: &req.networkConfig}
	if err := n.check(); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	p, ok, err := n.policy()
	if err == nil && !ok {
		err = errdefs.Errorf(errdefs.ErrInvalidArgument, "a network update names allow_internet_access, allowOut, denyOut or rules")
	}
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if _, err := s.m.UpdateNetwork(r.Context(), r.PathValue("id"), p); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
