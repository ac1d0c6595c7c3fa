package daemon

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/corralrun/corral/internal/driver/vm"
)

// openVM starts the VM driver when Config.Runtimes names "vm", or, when
// Runtimes is empty, when `corral doctor` finds it usable here (with KVM
// or, slowly, without). Its disks live under the state dir: they are as
// large as the sandboxes' roots.
func (d *Daemon) openVM(ctx context.Context) error {
	if !d.wantRuntime(ctx, "vm") {
		return nil
	}
	cfg := d.cfg
	vd, err := vm.New(vm.Config{
		Root:         filepath.Join(cfg.StateDir, "vm"),
		AgentPath:    cfg.AgentPath,
		CgroupParent: cfg.CgroupParent,
		Reaper:       d.reaper,
		Logger:       d.log,
	})
	if err != nil {
		return fmt.Errorf("starting vm driver: %w", err)
	}
	d.log.Info("vm runtime ready", "accel", vd.Accel())
	d.drivers = append(d.drivers, vd)
	return nil
}
