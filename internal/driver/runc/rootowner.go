package runc

import "github.com/corralrun/corral/internal/driver"

var _ driver.RootOwner = (*Driver)(nil)

// RootOwner implements driver.RootOwner (see RootHostIDs).
func (d *Driver) RootOwner(rootfs string) (driver.HostIDs, error) { return RootHostIDs(rootfs) }

// RootHostIDs returns the host IDs of the root user of a sandbox on
// rootfs: the first of its range (rootBase) when its template's owners
// were shifted (the sandbox runs in a user namespace), host root
// otherwise.
// Other OCI drivers (gVisor) map templates the same way.
func RootHostIDs(rootfs string) (driver.HostIDs, error) {
	base, ok, err := rootBase(rootfs)
	if err != nil || !ok {
		return driver.HostIDs{}, err
	}
	return driver.HostIDs{UID: base, GID: base}, nil
}
