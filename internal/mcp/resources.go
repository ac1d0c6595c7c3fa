package mcp

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// Resource URIs of sandboxes.
const (
	sandboxesURI = "corral://sandboxes"
	sandboxURI   = "corral://sandboxes/{id}"
)

// addResources serves the caller's sandboxes as resources: the list at
// corral://sandboxes and each one's state at corral://sandboxes/ID.
// resources/list is answered live from the API (a middleware), because
// the set of sandboxes changes with every create and delete.
func (s *Server) addResources() {
	s.mcp.AddResource(&mcp.Resource{URI: sandboxesURI, Name: "sandboxes", Title: "Sandboxes",
		Description: "Every sandbox you can use, with its state, as JSON", MIMEType: "application/json"}, s.readSandboxes)
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: sandboxURI, Name: "sandbox", Title: "A sandbox",
		Description: "One sandbox's state, limits, network policy and timeouts, as JSON", MIMEType: "application/json"}, s.readSandbox)
	s.mcp.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "resources/list" {
				return next(ctx, method, req)
			}
			res, err := next(ctx, method, req)
			if err != nil {
				return nil, err
			}
			list, ok := res.(*mcp.ListResourcesResult)
			if !ok || list.NextCursor != "" {
				return res, nil
			}
			// Without the daemon, the list still has the static entries.
			st, err := s.state(req)
			if err != nil {
				s.log.Warn("listing sandboxes as resources", "err", err)
				return list, nil
			}
			sbs, err := st.client.List(ctx, corral.ListOptions{})
			if err != nil {
				s.log.Warn("listing sandboxes as resources", "err", err)
				return list, nil
			}
			for _, sb := range sbs {
				list.Resources = append(list.Resources, &mcp.Resource{URI: sandboxesURI + "/" + sb.ID, Name: sb.ID,
					Title:       "Sandbox " + sb.ID,
					Description: describe(&sb, st.sessionID()), MIMEType: "application/json"})
			}
			return list, nil
		}
	})
}

func (s *Server) readSandboxes(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	st, err := s.state(req)
	if err != nil {
		return nil, err
	}
	sbs, err := st.client.List(ctx, corral.ListOptions{})
	if err != nil {
		return nil, err
	}
	own := st.sessionID()
	items := []map[string]any{}
	for i := range sbs {
		items = append(items, summary(&sbs[i], own))
	}
	return jsonResource(req.Params.URI, items)
}

func (s *Server) readSandbox(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	id, ok := strings.CutPrefix(req.Params.URI, sandboxesURI+"/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	st, err := s.state(req)
	if err != nil {
		return nil, err
	}
	sb, err := st.client.Get(ctx, id)
	if err != nil {
		if corral.ErrorCode(err) == corral.CodeNotFound {
			return nil, mcp.ResourceNotFoundError(req.Params.URI)
		}
		return nil, err
	}
	m := summary(sb, st.sessionID())
	m["metadata"], m["mounts"], m["idle_timeout"], m["on_deadline"], m["on_idle"], m["pids"], m["disk_mb"] =
		sb.Metadata, sb.Mounts, sb.IdleTimeout, sb.OnDeadline, sb.OnIdle, sb.Pids, sb.DiskMB
	return jsonResource(req.Params.URI, m)
}

func jsonResource(uri string, v any) (*mcp.ReadResourceResult, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}
