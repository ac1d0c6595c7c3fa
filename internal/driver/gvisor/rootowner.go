package gvisor

import (
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
)

var _ driver.RootOwner = (*Driver)(nil)

// RootOwner implements driver.RootOwner: gVisor shows templates with the
// same ID mapping as runc (runc.RootUserNS).
func (d *Driver) RootOwner(rootfs string) (driver.HostIDs, error) { return runc.RootHostIDs(rootfs) }
