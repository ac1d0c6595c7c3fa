package corral

import (
	"context"
	"net/url"
)

// CaptureReady makes the ready snapshot of template name on runtime (""
// for the daemon's default): a memory snapshot of a new sandbox of the
// template, taken once its service is ready, that later sandboxes of the
// template on that runtime start from instead of booting. It replaces the
// template's former one there and returns the template, whose
// ReadySnapshots names it. A runtime that cannot save memory fails with
// code failed_precondition.
func (c *Client) CaptureReady(ctx context.Context, name, runtime string) (*Template, error) {
	var t Template
	body := map[string]string{}
	if runtime != "" {
		body["runtime"] = runtime
	}
	if err := c.doJSON(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/ready-snapshot", nil, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DropReady removes the ready snapshot of template name on runtime (""
// for the daemon's default); its sandboxes there start cold again.
func (c *Client) DropReady(ctx context.Context, name, runtime string) (*Template, error) {
	var q url.Values
	if runtime != "" {
		q = url.Values{"runtime": {runtime}}
	}
	var t Template
	if err := c.doJSON(ctx, "DELETE", "/v1/templates/"+url.PathEscape(name)+"/ready-snapshot", q, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
