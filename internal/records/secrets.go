package records

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/corralrun/corral/internal/secrets"
)

// PutSecret inserts or replaces a secret record (its value sealed by
// package secrets, never the value).
func (s *Store) PutSecret(ctx context.Context, r secrets.Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding secret %s: %w", r.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO secrets (tenant, name, data) VALUES (?, ?, ?)
		 ON CONFLICT(tenant, name) DO UPDATE SET data = excluded.data`, r.Tenant, r.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing secret %s: %w", r.Name, err)
	}
	return nil
}

// DeleteSecret removes a secret record; a missing record is not an error.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name); err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return nil
}

// Secret returns a secret record and whether there is one.
func (s *Store) Secret(ctx context.Context, tenant, name string) (secrets.Record, bool, error) {
	var data string
	err := s.db.QueryRowContext(ctx, `SELECT data FROM secrets WHERE tenant = ? AND name = ?`, tenant, name).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return secrets.Record{}, false, nil
	}
	if err != nil {
		return secrets.Record{}, false, fmt.Errorf("reading secret %s: %w", name, err)
	}
	var r secrets.Record
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return secrets.Record{}, false, fmt.Errorf("decoding secret %s: %w", name, err)
	}
	return r, true, nil
}

// Secrets returns the secret records of tenant, by name.
func (s *Store) Secrets(ctx context.Context, tenant string) ([]secrets.Record, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("reading secrets: %w", err)
	}
	defer rows.Close()
	var out []secrets.Record
	for rows.Next() {
		var data string
		var r secrets.Record
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("reading secrets: %w", err)
		}
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return nil, fmt.Errorf("decoding secret record: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
