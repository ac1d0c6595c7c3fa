package agentclient

import (
	"context"
	"net/http"

	"github.com/corralrun/corral/internal/wire"
)

// StartService starts the sandbox's service and waits until it is ready,
// ctx ends or req.ReadyTimeoutMS passes. A service that cannot become
// ready (its command exited, the check timed out) is
// errdefs.ErrFailedPrecondition, with the start command's last output in
// the message; a sandbox whose service was started already is
// errdefs.ErrAlreadyExists. The service keeps running after the call
// returns, also after a failure to become ready, until the caller removes
// the sandbox or its process.
func (c *Client) StartService(ctx context.Context, req wire.ServiceRequest) (wire.ServiceStatus, error) {
	var st wire.ServiceStatus
	if err := c.call(ctx, "starting service", http.MethodPost, "/service", nil, req, &st); err != nil {
		return wire.ServiceStatus{}, err
	}
	return st, nil
}

// Service describes the sandbox's service; errdefs.ErrNotFound when none
// was started.
func (c *Client) Service(ctx context.Context) (wire.ServiceStatus, error) {
	var st wire.ServiceStatus
	if err := c.call(ctx, "describing service", http.MethodGet, "/service", nil, nil, &st); err != nil {
		return wire.ServiceStatus{}, err
	}
	return st, nil
}
