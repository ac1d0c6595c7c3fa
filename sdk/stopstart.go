package corral

import (
	"context"
	"time"
)

// Sandbox states a stopped sandbox passes through (Sandbox.State).
const (
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateStarting = "starting"
)

// Stop ends every process of sandbox id and frees its memory and CPU on
// the daemon; its files, network policy, environment, metadata and ID stay
// until Start. A stopped sandbox has no deadline and no idle timer.
// Exec and file calls fail with CodeFailedPrecondition until Start.
func (c *Client) Stop(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "POST", sandboxPath(id, "stop"), nil, map[string]any{}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Start boots stopped sandbox id again on its files and sets its deadline
// to now + timeout; nil takes the daemon's default timeout, NoTimeout asks
// for none. A daemon at capacity answers CodeBusy; the sandbox then stays
// stopped.
func (c *Client) Start(ctx context.Context, id string, timeout *time.Duration) (*Sandbox, error) {
	return c.withDeadline(ctx, id, "start", timeout)
}

// withDeadline posts action on sandbox id with the timeout body that
// resume and start take.
func (c *Client) withDeadline(ctx context.Context, id, action string, timeout *time.Duration) (*Sandbox, error) {
	body := map[string]*int64{}
	if timeout != nil {
		body["timeout"] = seconds(*timeout)
	}
	var sb Sandbox
	if err := c.doJSON(ctx, "POST", sandboxPath(id, action), nil, body, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
