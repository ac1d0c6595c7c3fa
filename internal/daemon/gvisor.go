package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/doctor"
	"github.com/corralrun/corral/internal/driver/gvisor"
	"github.com/corralrun/corral/internal/storage/btrfs"
)

// knownRuntimes are the names Config.Runtimes may hold.
var knownRuntimes = []string{"runc", "gvisor", "vm"}

// checkRuntimes refuses unknown runtime names and a default runtime that
// is not among the ones asked for.
func (c *Config) checkRuntimes() error {
	for _, r := range c.Runtimes {
		if !slices.Contains(knownRuntimes, r) {
			return fmt.Errorf("unknown runtime %q (use %s)", r, strings.Join(knownRuntimes, ", "))
		}
	}
	if len(c.Runtimes) > 0 && c.Runtime != "runc" && !slices.Contains(c.Runtimes, c.Runtime) {
		return fmt.Errorf("default runtime %q is not in --runtimes %s", c.Runtime, strings.Join(c.Runtimes, ","))
	}
	return nil
}

// openGVisor starts the gVisor driver when Config.Runtimes names it, or,
// when Runtimes is empty, when `corral doctor` finds gVisor usable here.
func (d *Daemon) openGVisor(ctx context.Context) error {
	cfg := d.cfg
	if !d.wantRuntime(ctx, "gvisor") {
		return nil
	}
	gd, err := gvisor.New(gvisor.Config{
		Root:         filepath.Join(cfg.RunDir, "gvisor"),
		RunscPath:    cfg.RunscPath,
		AgentPath:    cfg.AgentPath,
		CgroupParent: cfg.CgroupParent,
		Platform:     cfg.GVisorPlatform,
		Reaper:       d.reaper,
		OpenFiles:    cfg.OpenFiles,
		// As for runc: the ioctls have no other use inside a sandbox.
		DenyIoctls: btrfs.SubvolumeIoctls(),
		Logger:     d.log,
		IDSlots:    d.idSlots,
	})
	if err != nil {
		return fmt.Errorf("starting gvisor driver: %w", err)
	}
	d.drivers = append(d.drivers, gd)
	return nil
}

// wantRuntime says whether to start the driver of runtime name: when
// Config.Runtimes names it, or, when Runtimes is empty, when it is the
// default runtime or `corral doctor` finds it usable here.
func (d *Daemon) wantRuntime(ctx context.Context, name string) bool {
	cfg := d.cfg
	if len(cfg.Runtimes) > 0 {
		return slices.Contains(cfg.Runtimes, name)
	}
	if cfg.Runtime == name {
		return true
	}
	if d.doctor == nil {
		r := doctor.Run(ctx, doctor.RealHost())
		d.doctor = &r
	}
	for _, rt := range d.doctor.Runtimes {
		if rt.Name == name && !rt.Available {
			d.log.Info(name+" runtime not available (see corral doctor)", "needs", strings.Join(rt.Needs, ","))
			return false
		}
	}
	return true
}

// runtimesFlag is a comma-separated list of runtimes.
type runtimesFlag struct{ v *[]string }

func (f runtimesFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f runtimesFlag) Set(s string) error {
	*f.v = nil
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			*f.v = append(*f.v, r)
		}
	}
	return nil
}
