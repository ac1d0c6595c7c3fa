package records

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corralrun/corral/internal/tenancy"
)

// PutKey inserts or replaces an API key record (its secret's digest, never
// the secret).
func (s *Store) PutKey(ctx context.Context, k tenancy.Key) error {
	data, err := json.Marshal(k)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", k.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO api_keys (name, data) VALUES (?, ?)
		 ON CONFLICT(name) DO UPDATE SET data = excluded.data`, k.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing key %s: %w", k.Name, err)
	}
	return nil
}

// DeleteKey removes a key record; a missing record is not an error.
func (s *Store) DeleteKey(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE name = ?`, name); err != nil {
		return fmt.Errorf("deleting key %s: %w", name, err)
	}
	return nil
}

// Keys returns every key record, by name.
func (s *Store) Keys(ctx context.Context) ([]tenancy.Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM api_keys ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("reading keys: %w", err)
	}
	defer rows.Close()
	var out []tenancy.Key
	for rows.Next() {
		var data string
		var k tenancy.Key
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("reading keys: %w", err)
		}
		if err := json.Unmarshal([]byte(data), &k); err != nil {
			return nil, fmt.Errorf("decoding key record: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
