package secrets_test

import (
	"testing"

	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/secrets/secretstest"
)

func TestMemStoreConformance(t *testing.T) {
	secretstest.Run(t, func(*testing.T) secrets.Records { return secrets.NewMemStore() })
}
