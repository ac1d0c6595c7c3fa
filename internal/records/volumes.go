package records

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corralrun/corral/internal/sandbox"
)

// PutVolume inserts or replaces a volume record. Usage and users are not
// part of the record: the Manager works them out.
func (s *Store) PutVolume(ctx context.Context, v sandbox.Volume) error {
	v.UsedBytes, v.InUseBy = 0, nil
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding volume %s: %w", v.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO volumes (name, data) VALUES (?, ?)
		 ON CONFLICT(name) DO UPDATE SET data = excluded.data`, v.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing volume %s: %w", v.Name, err)
	}
	return nil
}

// DeleteVolume removes a volume record; a missing record is not an error.
func (s *Store) DeleteVolume(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE name = ?`, name); err != nil {
		return fmt.Errorf("deleting volume %s: %w", name, err)
	}
	return nil
}

// Volumes returns every volume record, by name.
func (s *Store) Volumes(ctx context.Context) ([]sandbox.Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM volumes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("reading volumes: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Volume
	for rows.Next() {
		var data string
		var v sandbox.Volume
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("reading volumes: %w", err)
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return nil, fmt.Errorf("decoding volume record: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
