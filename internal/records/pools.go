package records

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corralrun/corral/internal/sandbox"
)

var _ sandbox.PoolStore = (*Store)(nil)

// PutPool inserts or replaces a warm pool definition.
func (s *Store) PutPool(ctx context.Context, p sandbox.Pool) error {
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding pool %s: %w", p.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO pools (name, data) VALUES (?, ?)
		 ON CONFLICT(name) DO UPDATE SET data = excluded.data`, p.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing pool %s: %w", p.Name, err)
	}
	return nil
}

// DeletePool removes a pool definition; a missing one is not an error.
func (s *Store) DeletePool(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM pools WHERE name = ?`, name); err != nil {
		return fmt.Errorf("deleting pool %s: %w", name, err)
	}
	return nil
}

// Pools returns every pool definition, by name.
func (s *Store) Pools(ctx context.Context) ([]sandbox.Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, data FROM pools ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("reading pools: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Pool
	for rows.Next() {
		var name, data string
		if err := rows.Scan(&name, &data); err != nil {
			return nil, fmt.Errorf("reading pools: %w", err)
		}
		var p sandbox.Pool
		if err := json.Unmarshal([]byte(data), &p); err != nil {
			return nil, fmt.Errorf("decoding pool %s: %w", name, err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
