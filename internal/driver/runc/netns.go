package runc

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver/internal/ocirt"
)

// Prepared network namespaces and user namespaces (driver.Spec.Network).
//
// The daemon creates a sandbox's network namespace as host root, so the
// namespace belongs to the host's user namespace: sandbox root has no
// capability over it, whatever it has inside its own user namespace. Two
// things follow for sandboxes in user namespaces, both checked by
// TestNetworkNamespace:
//
//   - runc 1.1 joins the user namespace before every other namespace it
//     is given by path, and from inside it setns(2) into a network
//     namespace of the host's user namespace fails with EPERM ("the
//     caller must have CAP_SYS_ADMIN in the user namespace that owns the
//     namespace"). So the spec names no network namespace and the driver
//     starts runc on a thread that has joined the prepared one: the
//     container inherits it, as a process inherits its parent's.
//   - Mounting sysfs needs CAP_SYS_ADMIN in the user namespace that owns
//     the caller's network namespace (sysfs shows that namespace's
//     interfaces), which runc's init lacks there. The driver mounts a
//     read-only sysfs on the host from a thread in the sandbox's network
//     namespace, in the sandbox's slot directory, and the spec bind-mounts
//     it at /sys.
//
// Binding ports below 1024 needs CAP_NET_BIND_SERVICE in the user
// namespace that owns the network namespace, which sandbox root lacks as
// well; the driver sets the namespace's net.ipv4.ip_unprivileged_port_start
// to 0 instead (the namespace holds only the sandbox, so every port is
// its own).

// prepareNetNS readies the network namespace at netns for a sandbox in a
// user namespace: it mounts a read-only sysfs of that namespace at sysfs
// (a new directory) and lets unprivileged processes bind every port.
func prepareNetNS(netns, sysfs string) error {
	if err := os.Mkdir(sysfs, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating sysfs mount point: %w", err)
	}
	return ocirt.InNetNS(netns, func() error {
		// /proc/sys/net shows the namespace of the thread that opens it.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
			return fmt.Errorf("opening low ports: %w", err)
		}
		// sysfs takes the network namespace of the mounting task.
		if err := unix.Mount("sysfs", sysfs, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mounting sysfs for the sandbox: %w", err)
		}
		return nil
	})
}
