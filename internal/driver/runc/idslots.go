package runc

import (
	"errors"
	"fmt"
	"os"
)

// IDSlots lends the host-wide slot table (userns.go) to another driver
// whose sandboxes run in user namespaces it makes itself (gVisor's runsc
// makes its own from the OCI spec), so that its sandboxes and runc's never
// share a range. A slot it takes is recorded in a directory of the
// caller's, which stands for the sandbox as a runc sandbox directory does:
// the slot is stale, and reclaimed, once that directory is gone.
type IDSlots struct{ d *Driver }

// IDSlots returns the slot table of d, which shares d's lock, holder
// program and MountDir.
func (d *Driver) IDSlots() *IDSlots { return &IDSlots{d: d} }

// Reserve takes a free slot for the sandbox that dir (an existing
// directory) stands for, and returns the first host ID of the slot's range
// and the user namespace to ID-map the sandbox's layers with (layerMap;
// the caller closes it). It returns 0 and nil when template's owners were
// not shifted (PrepareTemplate): the sandbox runs as it is stored. On
// error nothing is taken.
func (s *IDSlots) Reserve(dir, template string) (uint32, *os.File, error) {
	if ok, err := shifted(template); err != nil || !ok {
		return 0, nil, err
	}
	n, _, err := s.d.allocSlot(dir)
	if err != nil {
		return 0, nil, err
	}
	base := rangeBase(n)
	lns, err := newUserNS(s.d.holder, ownerID(n), layerMap(base))
	if err != nil {
		return 0, nil, errors.Join(err, s.d.releaseSlot(dir))
	}
	defer lns.Close()
	f, err := os.Open(lns.Path)
	if err != nil {
		err = fmt.Errorf("opening the layers' user namespace: %w", err)
		return 0, nil, errors.Join(err, s.d.releaseSlot(dir))
	}
	return base, f, nil
}

// Release frees the slot recorded in dir, if any.
func (s *IDSlots) Release(dir string) error { return s.d.releaseSlot(dir) }
