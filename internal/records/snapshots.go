package records

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corralrun/corral/internal/sandbox"
)

// PutSnapshot inserts or replaces a snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, snap sandbox.Snapshot) error {
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encoding snapshot %s: %w", snap.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO snapshots (name, data) VALUES (?, ?)
		 ON CONFLICT(name) DO UPDATE SET data = excluded.data`, snap.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing snapshot %s: %w", snap.Name, err)
	}
	return nil
}

// DeleteSnapshot removes a snapshot record; a missing record is not an
// error.
func (s *Store) DeleteSnapshot(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE name = ?`, name); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", name, err)
	}
	return nil
}

// Snapshots returns every snapshot record, by name.
func (s *Store) Snapshots(ctx context.Context) ([]sandbox.Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM snapshots ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("reading snapshots: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Snapshot
	for rows.Next() {
		var data string
		var snap sandbox.Snapshot
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("reading snapshots: %w", err)
		}
		if err := json.Unmarshal([]byte(data), &snap); err != nil {
			return nil, fmt.Errorf("decoding snapshot record: %w", err)
		}
		out = append(out, snap)
	}
	return out, rows.Err()
}
