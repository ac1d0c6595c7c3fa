package corral

import (
	"context"
	"net/url"
	"time"
)

// Secret describes a secret of the caller's tenant. The daemon never
// returns a secret's value: a sandbox's network policy names the secret
// ({{secret:NAME}} in a header value) and the daemon adds the value to
// the sandbox's requests on the way out.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// UpdatedAt is when the value was last set, by create or rotate.
	UpdatedAt time.Time `json:"updated_at"`
}

// CreateSecret stores a secret of the caller's tenant (any key may; an
// admin key acts for the operator, or for the tenant of its
// X-Corral-Tenant header). A name the tenant already uses fails with
// CodeAlreadyExists. value is 1 byte to 64 KiB.
func (c *Client) CreateSecret(ctx context.Context, name, value string) (*Secret, error) {
	var s Secret
	body := struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}{name, value}
	if err := c.doJSON(ctx, "POST", "/v1/secrets", nil, body, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// RotateSecret replaces a secret's value; sandboxes that use it send the
// new value from their next request on. A missing secret fails with
// CodeNotFound.
func (c *Client) RotateSecret(ctx context.Context, name, value string) (*Secret, error) {
	var s Secret
	body := struct {
		Value string `json:"value"`
	}{value}
	if err := c.doJSON(ctx, "PUT", "/v1/secrets/"+url.PathEscape(name), nil, body, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Secrets lists the caller's tenant's secrets, by name, without values.
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	var out []Secret
	if err := c.doJSON(ctx, "GET", "/v1/secrets", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteSecret deletes a secret of the caller's tenant.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}
