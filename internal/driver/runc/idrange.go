package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

var _ driver.IDReserver = (*Driver)(nil)

// Host ID ranges per sandbox (see the comment on the constants in
// userns.go). Slot n, which also gives the namespace's owner and its
// mount point, runs the sandbox's IDs 0..idRange-1 as host IDs
// rangeBase(n).. . Above idBase the host ID space holds, one range each,
// the stored range, the owners, and then the slots' ranges.

// rangeBase returns the first host ID of slot n's range.
func rangeBase(n int) uint32 { return idBase + uint32(n+2)*idRange }

// rangeSlot returns the slot whose range starts at base, if any.
func rangeSlot(base uint32) (int, bool) {
	if base < rangeBase(0) || (base-idBase)%idRange != 0 {
		return 0, false
	}
	n := int((base-idBase)/idRange) - 2
	return n, n < idSlots
}

// sandboxMap is the uid_map(5) and gid_map of a sandbox's namespace that
// runs its IDs as the host IDs from base.
func sandboxMap(base uint32) string { return fmt.Sprintf("0 %d %d\n", base, idRange) }

// layerMap is the mapping that a root's layers are ID-mapped with to show
// the stored range as the range from base (storage.RootOptions.IDMap):
// stored ID idBase+i reads as base+i. 0 stays 0 for overlayfs's own
// files.
func layerMap(base uint32) string {
	return fmt.Sprintf("0 0 1\n%d %d %d\n", idBase, base, idRange)
}

// reservations are the sandboxes' namespaces that ReserveIDs made and
// Create has not taken yet, by sandbox ID.
type reservations struct {
	mu sync.Mutex
	ns map[string]*userNS
}

// take removes and returns sandbox id's reserved namespace, nil if none.
func (r *reservations) take(id string) *userNS {
	r.mu.Lock()
	defer r.mu.Unlock()
	ns := r.ns[id]
	delete(r.ns, id)
	return ns
}

func (r *reservations) put(id string, ns *userNS) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ns == nil {
		r.ns = map[string]*userNS{}
	}
	r.ns[id] = ns
}

// ReserveIDs implements driver.IDReserver: it makes sandbox id's
// directory, takes a slot for it (a spare's, with its namespaces made
// ahead, or a free one) and returns the layers' user namespace of the
// slot's range. The slot is recorded in the directory as for any
// sandbox, so a daemon restart keeps it and Delete frees it. Cost without
// a spare: allocSlot and two namespace holders (newUserNS).
func (d *Driver) ReserveIDs(ctx context.Context, id, template string) (_ *os.File, err error) {
	if err := driver.CheckID(id); err != nil {
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	if ok, err := shifted(template); err != nil || !ok {
		return nil, err
	}
	dir := d.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "reserving IDs for %s: sandbox directory exists", id)
		}
		return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
	}
	var u undo.Stack
	defer u.OnError(ctx, &err)
	u.Add(func(ctx context.Context) error { return d.destroy(ctx, id) })
	sp, ok := d.takeNSSpare(dir)
	if !ok {
		if sp, err = d.newRange(dir); err != nil {
			return nil, fmt.Errorf("reserving IDs for %s: %w", id, err)
		}
	}
	d.reserved.put(id, sp.ns)
	return sp.idmap, nil
}

// newRange takes a free slot for the directory dir, gives its directory
// to the slot's range, and makes the sandbox's namespace and the layers'
// one (layerMap). On error it frees what it took.
func (d *Driver) newRange(dir string) (sp nsSpare, err error) {
	n, mnt, err := d.allocSlot(dir)
	if err != nil {
		return nsSpare{}, err
	}
	sp = nsSpare{slot: n, mnt: mnt}
	defer func() {
		if err != nil {
			sp.close()
			err = errors.Join(err, d.releaseSlot(dir))
		}
	}()
	// runc bind-mounts the root from inside the namespace, where the
	// slot's 0700 directory must be searchable by the sandbox's root.
	base := rangeBase(n)
	if err := os.Chown(d.slotDir(n), int(base), int(base)); err != nil {
		return sp, fmt.Errorf("preparing slot %d: %w", n, err)
	}
	if sp.ns, err = newUserNS(d.holder, ownerID(n), sandboxMap(base)); err != nil {
		return sp, err
	}
	lns, err := newUserNS(d.holder, ownerID(n), layerMap(base))
	if err != nil {
		return sp, err
	}
	defer lns.Close()
	if sp.idmap, err = os.Open(lns.Path); err != nil {
		return sp, fmt.Errorf("opening the layers' user namespace: %w", err)
	}
	return sp, nil
}

// close releases the spare's namespaces (not its slot).
func (sp nsSpare) close() {
	if sp.ns != nil {
		sp.ns.Close()
	}
	if sp.idmap != nil {
		sp.idmap.Close()
	}
}
