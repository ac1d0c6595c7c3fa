package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/refill"
	"github.com/corralrun/corral/internal/subreaper"
	"github.com/corralrun/corral/internal/userns"
)

var (
	_ driver.Driver           = (*Driver)(nil)
	_ driver.Pauser           = (*Driver)(nil)
	_ driver.Updater          = (*Driver)(nil)
	_ driver.TemplatePreparer = (*Driver)(nil)
)

// Defaults of Config fields left zero.
const (
	DefaultCgroupParent = "/corral"
	DefaultStartTimeout = 10 * time.Second
	DefaultOpenFiles    = 4096
)

// Files in a sandbox directory.
const (
	configFile = "config.json"
	socketFile = "agent.sock"
	logFile    = "agent.log"
	pidFile    = "init.pid"
)

// Config configures a Driver.
type Config struct {
	// Root holds the driver's state: runc's state (runc --root) at
	// Root/state and one directory per sandbox at Root/sandboxes/<id>.
	// It must be an absolute path, short enough that
	// Root/sandboxes/<id>/agent.sock fits a unix socket address.
	Root string
	// RuncPath is the runc binary; "runc" from PATH when empty.
	RuncPath string
	// AgentPath is the host path of the static agent binary (the corral
	// binary itself), bind-mounted read-only into every sandbox.
	AgentPath string
	// CgroupParent is the cgroup under which each sandbox gets
	// <CgroupParent>/<id>; DefaultCgroupParent when empty.
	CgroupParent string
	// Reaper, when set, is told about each sandbox's init process so that
	// it reaps it when it exits. The daemon must be a child subreaper
	// (subreaper.SetSubreaper) for the init to become its child once
	// `runc run --detach` returns. Without a reaper, exited inits of a
	// subreaper daemon stay zombies until the daemon exits.
	Reaper *subreaper.Reaper
	// StartTimeout bounds Create from running runc to the agent's ready
	// line; DefaultStartTimeout when zero.
	StartTimeout time.Duration
	// OpenFiles is RLIMIT_NOFILE of every sandbox process;
	// DefaultOpenFiles when zero. It cannot exceed the daemon's own hard
	// limit (raising that needs CAP_SYS_RESOURCE).
	OpenFiles uint64
	// DenyIoctls are ioctl requests refused inside every sandbox besides
	// TIOCSTI; the daemon passes the btrfs subvolume ioctls, which would
	// let a sandbox escape its disk quota.
	DenyIoctls []uint64
	// UserNamespaces makes PrepareTemplate shift the owners of new
	// templates into the sandbox ID range (2^31 and up), and the
	// sandboxes of such templates run in user namespaces of their own,
	// where root is an unprivileged host user (see userns.go). Whether a
	// sandbox gets one is decided by its template, so templates built
	// with it keep working if it is later turned off. It adds making (or
	// taking) a user namespace to every Create.
	UserNamespaces bool
	// MountDir is where roots of sandboxes with user namespaces are
	// bind-mounted for runc, with the host-wide record of which namespace
	// owners are taken (see userns.go); DefaultMountDir when empty. It is
	// made mode 0711, and every directory above it must be searchable by
	// others.
	MountDir string
	// UserNSSpares is how many user namespaces, each with its slot and
	// its layers' namespace, the driver keeps made ahead for ReserveIDs
	// to take (spares.go); 0 makes each in ReserveIDs.
	UserNSSpares int
	// Logger receives lifecycle logs; nil discards them.
	Logger *slog.Logger
}

// Driver runs sandboxes as runc containers. It keeps no in-memory state
// about sandboxes: everything lives in Root and in runc's state, so a new
// Driver on the same Root takes over the sandboxes of a crashed daemon.
// Methods are safe for concurrent use on different IDs; the caller
// serializes calls for the same ID.
type Driver struct {
	cfg       Config
	host      Host
	stateDir  string
	boxesDir  string
	mountDir  string
	holder    *userns.Holder // nil: namespaces are made by re-executing this binary
	spares    nsSpares
	reserved  reservations // sandboxes' namespaces from ReserveIDs, until Create
	log       *slog.Logger
	runcPath  string
	cgroupsV2 bool
	cli       ocirt.CLI
}

// New checks cfg, fills in defaults, creates the directories under Root
// and detects the host's cgroup version. It does not touch existing
// sandboxes; it clears user namespace slots whose sandbox is gone
// (sweepSlots).
func New(cfg Config) (*Driver, error) {
	agent, runcPath, err := ocirt.Resolve("runc", cfg.Root, cfg.AgentPath, cfg.RuncPath)
	if err != nil {
		return nil, err
	}
	cfg.AgentPath = agent
	if cfg, err = withDefaults(cfg); err != nil {
		return nil, err
	}
	v2, swap, err := ocirt.DetectCgroups()
	if err != nil {
		return nil, err
	}
	d := newDriver(cfg, runcPath, v2, swap)
	for _, dir := range []string{d.stateDir, d.boxesDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating runc driver directory: %w", err)
		}
	}
	if err := d.openUserNS(); err != nil {
		return nil, err
	}
	// Last, as nothing after it fails: New does not close it.
	if sealed, err := ocirt.NewSealed(runcPath); err == nil {
		d.cli.Sealed = sealed
	} else {
		d.log.Info("runc runs from its file, copying itself at every start", "reason", err)
	}
	return d, nil
}

// withDefaults returns cfg with its zero fields set to their defaults,
// failing when its open files limit is one runc cannot give.
func withDefaults(cfg Config) (Config, error) {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OpenFiles == 0 {
		cfg.OpenFiles = DefaultOpenFiles
	}
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return cfg, fmt.Errorf("reading open files limit: %w", err)
	}
	if cfg.OpenFiles > nofile.Max {
		return cfg, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"open files limit %d exceeds the daemon's own hard limit %d, which runc cannot raise", cfg.OpenFiles, nofile.Max)
	}
	if cfg.MountDir == "" {
		cfg.MountDir = DefaultMountDir
	}
	return cfg, nil
}

// newDriver makes the Driver of a complete cfg, on a host whose cgroup
// version and swap accounting are v2 and swap.
func newDriver(cfg Config, runcPath string, v2, swap bool) *Driver {
	d := &Driver{
		cfg:      cfg,
		stateDir: filepath.Join(cfg.Root, "state"),
		boxesDir: filepath.Join(cfg.Root, "sandboxes"),
		mountDir: cfg.MountDir,
		log:      cfg.Logger.With("driver", "runc"),
		runcPath: runcPath,
		host: Host{
			AgentPath:      cfg.AgentPath,
			CgroupParent:   cfg.CgroupParent,
			CgroupV2:       v2,
			SwapAccounting: swap,
			Arch:           runtime.GOARCH,
			OpenFiles:      cfg.OpenFiles,
			DenyIoctls:     slices.Clone(cfg.DenyIoctls),
		},
		cgroupsV2: v2,
	}
	// The agent installs the seccomp filter itself where Corral can
	// compile it: runc would compile it with libseccomp in every `runc
	// init`.
	if prog, err := d.host.CompileSeccomp(); err == nil {
		d.host.InitSeccomp = prog
	} else {
		d.log.Info("the runtime installs the seccomp profile", "reason", err)
	}
	d.cli = ocirt.CLI{Name: "runc", Path: runcPath, Root: d.stateDir}
	d.spares.refill = refill.New(spareDelay, d.makeOneNSSpare)
	return d
}

// openUserNS readies what sandboxes with user namespaces need: MountDir,
// the slots of an earlier driver cleared, and the holder program.
func (d *Driver) openUserNS() error {
	// Made whether or not new templates get user namespaces: existing
	// ones may have them.
	if err := ocirt.PrepareSearchableDir(d.cfg.MountDir); err != nil {
		return err
	}
	// An earlier driver's spares: without their markers their slots are
	// stale, and the sweep frees them.
	if err := os.RemoveAll(d.sparesDir()); err != nil {
		return fmt.Errorf("removing spare user namespaces: %w", err)
	}
	if n, err := d.sweepSlots(); err != nil {
		d.log.Warn("clearing stale user namespace slots", "cleared", n, "error", err)
	} else if n > 0 {
		d.log.Info("cleared stale user namespace slots", "cleared", n)
	}
	// newUserNS runs the holder as an unprivileged user.
	var err error
	if d.holder, err = userns.OpenHolder(); err != nil {
		d.log.Info("user namespaces are made by re-executing this binary", "reason", err)
		if fi, err := os.Stat("/proc/self/exe"); err != nil || fi.Mode().Perm()&0o001 == 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument,
				"this executable must be executable by other users (mode o+x): it runs unprivileged to make user namespaces")
		}
	}
	return nil
}

// Name returns "runc".
func (d *Driver) Name() string { return "runc" }

// Capabilities reports pause (cgroup freezer) and container isolation.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Pause: true, Isolation: "container"}
}

// Close removes the spare user namespaces and releases the holder
// program; sandboxes keep running. The driver cannot create sandboxes
// afterwards.
func (d *Driver) Close() error {
	d.closeNSSpares()
	if d.cli.Sealed != nil {
		d.cli.Sealed.Close()
	}
	return d.holder.Close()
}

func (d *Driver) dir(id string) string { return filepath.Join(d.boxesDir, id) }

func (d *Driver) cgroupPath(id string) string { return path.Join("/", d.cfg.CgroupParent, id) }

func (d *Driver) cgroup(id string) ocirt.Cgroup {
	return ocirt.Cgroup{V2: d.cgroupsV2, Path: d.cgroupPath(id)}
}

// Delete kills the container, removes it from runc, removes its cgroups
// and its directory. It succeeds for unknown IDs and for every partial
// state a failed Create or a daemon crash can leave.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("deleting container %s: %w", id, err)
	}
	if err := d.destroy(ctx, id); err != nil {
		return fmt.Errorf("deleting container %s: %w", id, err)
	}
	return nil
}

// destroy is Delete without the error prefix.
//
// `runc delete --force` on a running container sends SIGKILL and then
// polls in 100 ms sleeps until the init is gone; killing first and waiting
// for the init ourselves, then deleting a stopped container, ends as soon
// as the init does.
func (d *Driver) destroy(ctx context.Context, id string) error {
	if ns := d.reserved.take(id); ns != nil {
		ns.Close()
	}
	dir := d.dir(id)
	cg := d.cgroup(id)
	if _, err := os.Stat(filepath.Join(d.stateDir, id)); err == nil {
		if _, err := d.cli.Run(ctx, nil, "kill", id, "KILL"); err == nil {
			// A frozen init cannot die; thaw it so the signal lands.
			if cg.Frozen() {
				if _, err := d.cli.Run(ctx, nil, "resume", id); err != nil {
					d.log.Warn("resuming container to kill it", "sandbox_id", id, "error", err)
				}
			}
			if pid, err := ocirt.ReadPid(filepath.Join(dir, pidFile)); err == nil {
				ocirt.WaitExited(ctx, pid, 5*time.Second)
			}
		}
		if _, err := d.cli.Run(ctx, nil, "delete", "--force", id); err != nil && !ocirt.IsNotExist(err) {
			return err
		}
	}
	if err := cg.Remove(); err != nil {
		return err
	}
	// Before the directory goes: the slot's owner link points at it, and
	// a slot whose owner is gone may be taken by another sandbox.
	if err := d.releaseSlot(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing sandbox directory: %w", err)
	}
	return nil
}

// Status asks runc for the container's state. A container whose init has
// exited and one that was created but never started are both stopped.
func (d *Driver) Status(ctx context.Context, id string) (driver.Status, error) {
	st, err := d.cli.State(ctx, id)
	if err != nil {
		return "", fmt.Errorf("reading state of container %s: %w", id, err)
	}
	return st, nil
}

// List returns the IDs that have runc state or a sandbox directory, sorted:
// running sandboxes and the leftovers of interrupted creates and deletes.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	ids, err := ocirt.ListDirs(d.stateDir, d.boxesDir)
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	return ids, nil
}

// DialAgent connects to the agent's socket in the sandbox directory.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	if err := driver.CheckID(id); err != nil {
		return nil, fmt.Errorf("dialing agent of %s: %w", id, err)
	}
	sock := filepath.Join(d.dir(id), socketFile)
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", sock)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
		return nil, fmt.Errorf("dialing agent of %s: %w", id, err)
	}
	return c, nil
}

// Stats reads the container's cgroup files; it does not run runc.
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	return ocirt.InstanceStats(id, d.cgroup)
}

// OOMKills reads the OOM-kill count of instance id's cgroup.
func (d *Driver) OOMKills(ctx context.Context, id string) (int64, error) {
	return ocirt.InstanceOOMKills(id, d.cgroup)
}

// Pause freezes every process of the container (cgroup freezer).
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.freeze(ctx, "pausing", id, true)
}

// Resume thaws a paused container.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.freeze(ctx, "resuming", id, false)
}

// freeze writes the container's freezer cgroup itself, as `runc pause`
// and `runc resume` would (see ocirt.Cgroup.Freeze), after checking that
// runc knows the container.
func (d *Driver) freeze(ctx context.Context, doing, id string, frozen bool) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("%s container %s: %w", doing, id, err)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, id)); err != nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "%s container %s: not found", doing, id)
	}
	cg := d.cgroup(id)
	if cg.Frozen() == frozen {
		state := map[bool]string{true: "paused", false: "not paused"}[frozen]
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s container %s: it is %s", doing, id, state)
	}
	if err := cg.Freeze(ctx, frozen); err != nil {
		return fmt.Errorf("%s container %s: %w", doing, id, err)
	}
	return nil
}

// Update replaces the container's CPU, memory and pids limits, all or
// nothing (ocirt.Cgroup.SetLimits); zero fields lift a limit. Lowering
// memory below current usage makes the kernel reclaim or OOM-kill inside
// the sandbox. It writes the cgroup files itself rather than through `runc
// update`, which sets one file after the other and leaves those it set
// when a later one fails; runc's record of the limits in its state keeps
// the values of the create, which the driver never reads back.
func (d *Driver) Update(ctx context.Context, id string, r driver.Resources) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("updating container %s: %w", id, err)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, id)); err != nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "updating container %s: not found", id)
	}
	if _, err := d.cgroup(id).SetLimits(ocirt.LimitsOf(r), d.host.SwapAccounting); err != nil {
		return fmt.Errorf("updating container %s: %w", id, err)
	}
	return nil
}
