package secrets

import (
	"context"
	"fmt"
)

// Source resolves the secrets a sandbox's egress names: secret NAME of
// the tenant that owns the sandbox, so that a policy's {{secret:NAME}}
// never reaches another tenant's secret. It has the method set of the
// egress proxy's secret source; its Secret is called per request, so a
// rotated value is used from the next request on.
type Source struct {
	Store *Store
	// Owner returns the tenant that owns a sandbox ("" for the
	// operator's), or an error when there is no such sandbox.
	Owner func(ctx context.Context, sandboxID string) (string, error)
}

// Secret returns the value of secret name for sandbox sandboxID's tenant.
// Errors name the sandbox and the secret, never the value.
func (s Source) Secret(ctx context.Context, sandboxID, name string) (string, error) {
	tenant, err := s.Owner(ctx, sandboxID)
	if err != nil {
		return "", fmt.Errorf("finding the tenant of sandbox %s: %w", sandboxID, err)
	}
	v, err := s.Store.Value(ctx, tenant, name)
	if err != nil {
		return "", fmt.Errorf("secret for sandbox %s: %w", sandboxID, err)
	}
	return v, nil
}
