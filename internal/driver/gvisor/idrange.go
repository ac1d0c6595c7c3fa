package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

var _ driver.IDReserver = (*Driver)(nil)

// idsDir holds, per sandbox whose host IDs ReserveIDs took, the directory
// that records its slot in the shared table (Config.IDSlots). It is apart
// from the sandbox directory, which Create makes: the reservation comes
// first.
func (d *Driver) idsDir(id string) string { return filepath.Join(d.cfg.Root, "ids", id) }

// ReserveIDs implements driver.IDReserver with a slot of the table shared
// with the runc driver (Config.IDSlots): runsc then runs the sandbox, its
// gofer included, under the slot's range, which it reads off the root
// (runc.RootUserNS) as runc does. Without a table, or for a template
// whose owners were not shifted, it returns nil and the sandbox runs in
// the stored range.
func (d *Driver) ReserveIDs(ctx context.Context, id, template string) (*os.File, error) {
	if err := driver.CheckID(id); err != nil {
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	if d.cfg.IDSlots == nil {
		return nil, nil
	}
	dir := d.idsDir(id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "reserving IDs for %s: already reserved", id)
		}
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	_, ns, err := d.cfg.IDSlots.Reserve(dir, template)
	if ns != nil {
		return ns, nil
	}
	// Nothing reserved: the stored range, or an error.
	if err = errors.Join(err, os.Remove(dir)); err != nil {
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	return nil, nil
}

// releaseIDs frees the slot that ReserveIDs took for sandbox id, if any.
func (d *Driver) releaseIDs(id string) error {
	if d.cfg.IDSlots == nil {
		return nil
	}
	dir := d.idsDir(id)
	if err := d.cfg.IDSlots.Release(dir); err != nil {
		return fmt.Errorf("releasing host IDs: %w", err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("releasing host IDs: %w", err)
	}
	return nil
}

// sweepIDs frees the slots of reservations without a sandbox directory:
// a daemon that died between ReserveIDs and Create left them, and no
// sandbox remains for the Manager to Delete. Run by New, before any
// reservation of this driver.
func (d *Driver) sweepIDs() error {
	entries, err := os.ReadDir(filepath.Join(d.cfg.Root, "ids"))
	if errors.Is(err, fs.ErrNotExist) || d.cfg.IDSlots == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing host ID reservations: %w", err)
	}
	for _, e := range entries {
		if _, err := os.Lstat(d.dir(e.Name())); err == nil || driver.CheckID(e.Name()) != nil {
			continue
		}
		if err := d.releaseIDs(e.Name()); err != nil {
			return err
		}
	}
	return nil
}
