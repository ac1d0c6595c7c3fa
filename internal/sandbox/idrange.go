package sandbox

import (
	"context"
	"fmt"
	"os"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/undo"
)

// reserveIDs reserves host IDs of its own for sandbox sb when its driver
// runs sandboxes under such IDs (driver.IDReserver), and returns the user
// namespace its root is to be made with (nil when there is none), which
// the caller closes. The release, the driver's Delete, is on u once the
// IDs are reserved.
func (m *Manager) reserveIDs(ctx context.Context, u *undo.Stack, sb Sandbox) (*os.File, error) {
	drv := m.drivers[sb.Runtime]
	r, ok := drv.(driver.IDReserver)
	if !ok {
		return nil, nil
	}
	ns, err := r.ReserveIDs(ctx, sb.ID, m.cfg.Storage.TemplatePath(sb.Template))
	if err != nil {
		return nil, fmt.Errorf("reserving host IDs for sandbox %s: %w", sb.ID, err)
	}
	u.Add(func(ctx context.Context) error {
		if err := drv.Delete(ctx, sb.ID); err != nil {
			return fmt.Errorf("releasing host IDs of sandbox %s: %w", sb.ID, err)
		}
		return nil
	})
	return ns, nil
}

// rootShift is how sandbox sb's root at root shows the stored IDs: moved
// to its driver's root IDs (driver.RootOwner) when they are a range of
// their own, unshifted otherwise.
func (m *Manager) rootShift(sb Sandbox, root string) snapshotdir.IDShift {
	ro, ok := m.drivers[sb.Runtime].(driver.RootOwner)
	if !ok {
		return snapshotdir.IDShift{}
	}
	ids, err := ro.RootOwner(root)
	if err != nil || ids.UID <= driver.StoredIDBase {
		return snapshotdir.IDShift{}
	}
	return snapshotdir.IDShift{From: driver.StoredIDBase, To: int(ids.UID), Size: driver.StoredIDSize}
}
