package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/driver/runc"
)

// DefaultMountDir is the host-wide directory under which each driver
// (one per daemon Root) keeps its sandboxes' boxes when Config.MountDir
// is empty.
const DefaultMountDir = "/run/corral-gvisor"

// A box is what the gofer must reach of a sandbox, in a directory every
// user can search:
//
//	<MountDir>/<id>/          mode 0700, owned by the sandbox's root
//	<MountDir>/<id>/run/      the agent's socket directory (RunDest)
//	<MountDir>/<id>/rootfs    bind mount of the root file system  } with an
//	<MountDir>/<id>/agent     bind mount of the agent binary      } ID mapping
//	<MountDir>/<id>/resolv.conf, hosts,  bind mounts (Spec.Network) } only
//	  ca-bundle.crt, egress-ca.pem
//
// With an ID mapping (a template whose owners the runc driver shifted),
// runsc runs the gofer in the sandbox's user namespace as the sandbox's
// root, an unprivileged host user who cannot search the daemon's 0700
// state directory, where storage keeps roots and the network package its
// files: it could open none of them. Without a mapping the gofer is host
// root and the box holds only the socket directory.
//
// Host directory mounts (Spec.Mounts) need no entry: runsc reaches the
// sources of bind mounts with host root's access, whatever the ID
// mapping, so a source in a directory only host root can search serves.
//
// boxMounts are the entries that may be mount points, in unmount order.
var boxMounts = []string{"rootfs", "agent", "resolv.conf", "hosts", "ca-bundle.crt", "egress-ca.pem"}

// MountDirFor is the MountDir of a driver with Config.Root root that
// names none: DefaultMountDir/<hash of root>, so that daemons with their
// own Roots never share boxes.
func MountDirFor(root string) string {
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(DefaultMountDir, hex.EncodeToString(sum[:4]))
}

func (d *Driver) box(id string) string { return filepath.Join(d.cfg.MountDir, id) }

// makeBox creates sandbox id's box for spec and ID mapping u and returns
// the spec and host with the paths the gofer opens replaced by the box's.
// On error the caller removes the box with removeBox.
func (d *Driver) makeBox(id string, spec driver.Spec, u runc.UserNS) (driver.Spec, runc.Host, error) {
	host := d.host
	box := d.box(id)
	// New made MountDir; a driver closed meanwhile on the same Root may
	// have removed it while empty.
	if err := os.MkdirAll(d.cfg.MountDir, 0o711); err != nil {
		return spec, host, fmt.Errorf("creating sandbox box: %w", err)
	}
	if err := os.Mkdir(box, 0o700); err != nil {
		return spec, host, fmt.Errorf("creating sandbox box: %w", err)
	}
	if err := os.Mkdir(filepath.Join(box, runDir), 0o755); err != nil {
		return spec, host, fmt.Errorf("creating sandbox box: %w", err)
	}
	if u.Size == 0 {
		return spec, host, nil
	}
	if err := os.Chown(box, int(u.HostID), int(u.HostID)); err != nil {
		return spec, host, fmt.Errorf("creating sandbox box: %w", err)
	}
	bind := func(src, name string, dir bool) (string, error) {
		dst := filepath.Join(box, name)
		var err error
		if dir {
			err = os.Mkdir(dst, 0o755)
		} else {
			err = os.WriteFile(dst, nil, 0o444)
		}
		if err == nil {
			err = ocirt.Bind(src, dst)
		}
		return dst, err
	}
	var err error
	if spec.RootFS, err = bind(spec.RootFS, "rootfs", true); err != nil {
		return spec, host, err
	}
	if host.AgentPath, err = bind(host.AgentPath, "agent", false); err != nil {
		return spec, host, err
	}
	if spec.Network != nil {
		n := *spec.Network
		for _, f := range []struct {
			path *string
			name string
		}{{&n.ResolvConf, "resolv.conf"}, {&n.Hosts, "hosts"}, {&n.CABundle, "ca-bundle.crt"}, {&n.CACert, "egress-ca.pem"}} {
			if *f.path != "" {
				if *f.path, err = bind(*f.path, f.name, false); err != nil {
					return spec, host, err
				}
			}
		}
		spec.Network = &n
	}
	return spec, host, nil
}

// removeBox unmounts and removes sandbox id's box. It removes entries one
// by one, never recursively: a root that failed to unmount must make it
// fail, not be deleted.
func (d *Driver) removeBox(id string) error {
	box := d.box(id)
	for _, name := range boxMounts {
		p := filepath.Join(box, name)
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	entries := append([]string{filepath.Join(runDir, socketFile), filepath.Join(runDir, oldLimitsFile), filepath.Join(runDir, oldSeccompFile), runDir}, boxMounts...)
	for _, name := range append(entries, "") {
		if err := os.Remove(filepath.Join(box, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing sandbox box: %w", err)
		}
	}
	return nil
}
