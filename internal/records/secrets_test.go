package records

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/secrets/secretstest"
)

func TestSecretsConformance(t *testing.T) {
	secretstest.Run(t, func(t *testing.T) secrets.Records {
		s, err := Open(t.Context(), filepath.Join(t.TempDir(), "corral.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestSecretsSurviveReopen keeps a secret in SQLite across a restart and
// checks that the database file never holds its value.
func TestSecretsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	path, keyPath := filepath.Join(dir, "corral.db"), filepath.Join(dir, "secrets.key")
	const value = "ghp_0123456789abcdefghijklmnopqrstuvwxyz"
	open := func() (*Store, *secrets.Store) {
		st, err := Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		sec, err := secrets.Open(st, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		return st, sec
	}
	st, sec := open()
	if _, err := sec.Create(t.Context(), "acme", "github", value); err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, name := range []string{"corral.db", "corral.db-wal"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil && bytes.Contains(b, []byte(value)) {
			t.Errorf("%s holds the value in clear", name)
		}
	}
	st, sec = open()
	defer st.Close()
	if v, err := sec.Value(t.Context(), "acme", "github"); err != nil || v != value {
		t.Fatalf("value after reopen: %q %v", v, err)
	}
	if list, err := sec.List(t.Context(), "acme"); err != nil || len(list) != 1 || list[0].Name != "github" {
		t.Fatalf("list after reopen: %+v %v", list, err)
	}
}
