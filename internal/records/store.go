// Package records persists Corral's records (sandboxes, templates, pools,
// snapshots, volumes, API keys, encrypted secrets) in SQLite
// (modernc.org/sqlite, pure Go) under the state directory. It is the source
// of truth that a restarted daemon reconciles the host against. It stores
// records; it does not decide anything about them.
package records

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/tenancy"
)

// Store is a SQLite-backed sandbox.Store. It is safe for concurrent use;
// writes are serialized through one connection.
type Store struct {
	db *sql.DB
}

var (
	_ sandbox.Store         = (*Store)(nil)
	_ sandbox.SnapshotStore = (*Store)(nil)
	_ sandbox.VolumeStore   = (*Store)(nil)
	_ tenancy.Store         = (*Store)(nil)
	_ secrets.Records       = (*Store)(nil)
)

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id    TEXT PRIMARY KEY,
	state TEXT NOT NULL,
	data  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS templates (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pools (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS volumes (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets (
	tenant TEXT NOT NULL,
	name   TEXT NOT NULL,
	data   TEXT NOT NULL,
	PRIMARY KEY (tenant, name)
);
`

// Open opens (creating if needed) the database at path.
//
// The database uses write-ahead logging with synchronous=NORMAL: a commit
// survives a crash of the daemon (SIGKILL included) but the last commits
// before a power loss may be lost, with the database still consistent. That
// is safe here because a restarted daemon releases every instance and root
// that no record names, so a lost "creating" record cannot leak resources.
// It saves an fsync per write on the create path.
func Open(ctx context.Context, path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening database %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating schema in %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// PutSandbox inserts or replaces a sandbox record.
func (s *Store) PutSandbox(ctx context.Context, sb sandbox.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("encoding sandbox %s: %w", sb.ID, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO sandboxes (id, state, data) VALUES (?, ?, ?)
		 ON CONFLICT(id) DO UPDATE SET state = excluded.state, data = excluded.data`,
		sb.ID, sb.State.String(), string(data))
	if err != nil {
		return fmt.Errorf("writing sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// DeleteSandbox removes a sandbox record; a missing record is not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

// Sandboxes returns every sandbox record.
func (s *Store) Sandboxes(ctx context.Context) ([]sandbox.Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, data FROM sandboxes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("reading sandboxes: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Sandbox
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return nil, fmt.Errorf("reading sandboxes: %w", err)
		}
		var sb sandbox.Sandbox
		if err := json.Unmarshal([]byte(data), &sb); err != nil {
			return nil, fmt.Errorf("decoding sandbox %s: %w", id, err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// PutTemplate inserts or replaces a template record.
func (s *Store) PutTemplate(ctx context.Context, t sandbox.Template) error {
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encoding template %s: %w", t.Name, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO templates (name, data) VALUES (?, ?)
		 ON CONFLICT(name) DO UPDATE SET data = excluded.data`, t.Name, string(data))
	if err != nil {
		return fmt.Errorf("writing template %s: %w", t.Name, err)
	}
	return nil
}

// DeleteTemplate removes a template record; a missing record is not an error.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM templates WHERE name = ?`, name); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	return nil
}

// Templates returns every template record.
func (s *Store) Templates(ctx context.Context) ([]sandbox.Template, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, data FROM templates ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("reading templates: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Template
	for rows.Next() {
		var name, data string
		if err := rows.Scan(&name, &data); err != nil {
			return nil, fmt.Errorf("reading templates: %w", err)
		}
		var t sandbox.Template
		if err := json.Unmarshal([]byte(data), &t); err != nil {
			return nil, fmt.Errorf("decoding template %s: %w", name, err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
