package corral

import (
	"context"
	"net/url"
	"time"
)

// Pool is a warm pool: sandboxes of one shape created ahead, which creates
// of that shape (or naming the pool) claim. Claimed sandboxes are never
// returned to a pool.
type Pool struct {
	Name     string  `json:"name"`
	Template string  `json:"template"`
	Runtime  string  `json:"runtime"`
	CPUs     float64 `json:"cpus"`
	MemoryMB int64   `json:"memory_mb"`
	Pids     int64   `json:"pids"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	Network  string  `json:"network"`
	Size     int     `json:"size"`
	// Ready sandboxes can be claimed; Filling ones are being made.
	Ready   int `json:"ready"`
	Filling int `json:"filling"`
	// Error is the last refill failure while refills back off until
	// RetryAt.
	Error   string     `json:"error,omitempty"`
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

// PoolOptions are the shape and size of a pool. Zero resources take the
// daemon's defaults; an empty Runtime and Network the daemon's default
// runtime and network mode.
type PoolOptions struct {
	Template string  `json:"template"`
	Runtime  string  `json:"runtime,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	Pids     int64   `json:"pids,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	Network  string  `json:"network,omitempty"`
	Size     int     `json:"size"`
}

// SetPool defines pool name or changes it. The daemon fills it in the
// background; sandboxes of an older shape or beyond a smaller size are
// deleted before it returns.
func (c *Client) SetPool(ctx context.Context, name string, opts PoolOptions) (*Pool, error) {
	var p Pool
	if err := c.doJSON(ctx, "PUT", "/v1/pools/"+url.PathEscape(name), nil, opts, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetPool returns one pool.
func (c *Client) GetPool(ctx context.Context, name string) (*Pool, error) {
	var p Pool
	if err := c.doJSON(ctx, "GET", "/v1/pools/"+url.PathEscape(name), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Pools lists the pools by name.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out []Pool
	if err := c.doJSON(ctx, "GET", "/v1/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeletePool deletes a pool and its unclaimed sandboxes.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/pools/"+url.PathEscape(name), nil, nil, nil)
}
