package corral

import (
	"context"
	"net/url"
)

// Change is a path a sandbox changed under a copy-on-write mount,
// compared with the host directory, which the sandbox never changes.
type Change struct {
	// Path is the path in the sandbox.
	Path string `json:"path"`
	// Kind is ChangeAdded, ChangeModified or ChangeDeleted.
	Kind string `json:"kind"`
}

// Change kinds, for Change.Kind.
const (
	ChangeAdded    = "added"
	ChangeModified = "modified"
	ChangeDeleted  = "deleted"
)

// MountChanges lists, by path, what sandbox id changed under its
// copy-on-write mount at target.
func (c *Client) MountChanges(ctx context.Context, id, target string) ([]Change, error) {
	var out struct {
		Changes []Change `json:"changes"`
	}
	q := url.Values{"target": {target}}
	if err := c.doJSON(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/mounts/changes", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Changes, nil
}
