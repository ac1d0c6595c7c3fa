package corral

import (
	"context"
	"net/url"
	"time"
)

// Key is an API key record. Key (the secret) is set only in the answers
// of CreateKey and RotateKey: the daemon keeps a digest of it alone.
type Key struct {
	Name             string    `json:"name"`
	Tenant           string    `json:"tenant"`
	Admin            bool      `json:"admin,omitempty"`
	MaxSandboxes     int       `json:"max_sandboxes,omitempty"`
	MaxMemoryMB      int64     `json:"max_memory_mb,omitempty"`
	MaxCPUs          float64   `json:"max_cpus,omitempty"`
	MaxDiskMB        int64     `json:"max_disk_mb,omitempty"`
	CreatesPerMinute int       `json:"creates_per_minute,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	RotatedAt        time.Time `json:"rotated_at,omitzero"`
	Key              string    `json:"key,omitempty"`
}

// KeyOptions describe a new key: Name is required, Tenant defaults to
// Name, and the quotas (zero: none) bound everything the tenant holds.
type KeyOptions struct {
	Name             string  `json:"name"`
	Tenant           string  `json:"tenant,omitempty"`
	Admin            bool    `json:"admin,omitempty"`
	MaxSandboxes     int     `json:"max_sandboxes,omitempty"`
	MaxMemoryMB      int64   `json:"max_memory_mb,omitempty"`
	MaxCPUs          float64 `json:"max_cpus,omitempty"`
	MaxDiskMB        int64   `json:"max_disk_mb,omitempty"`
	CreatesPerMinute int     `json:"creates_per_minute,omitempty"`
}

// CreateKey makes an API key (admin keys and the unix socket only) and
// returns it with its secret in Key, which cannot be read again.
func (c *Client) CreateKey(ctx context.Context, o KeyOptions) (*Key, error) {
	var k Key
	if err := c.doJSON(ctx, "POST", "/v1/keys", nil, o, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// Keys lists the API keys, without secrets.
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	var out []Key
	if err := c.doJSON(ctx, "GET", "/v1/keys", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteKey revokes a key: its requests, open streams included, end
// within moments.
func (c *Client) DeleteKey(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/keys/"+url.PathEscape(name), nil, nil, nil)
}

// RotateKey gives a key a new secret, returned in Key; the old one stops
// working at once.
func (c *Client) RotateKey(ctx context.Context, name string) (*Key, error) {
	var k Key
	if err := c.doJSON(ctx, "POST", "/v1/keys/"+url.PathEscape(name)+"/rotate", nil, nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}
