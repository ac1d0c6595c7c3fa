package gvisor

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/agentdialout"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/subreaper"
)

var (
	_ driver.Driver           = (*Driver)(nil)
	_ driver.Pauser           = (*Driver)(nil)
	_ driver.Updater          = (*Driver)(nil)
	_ driver.TemplatePreparer = (*Driver)(nil)
	_ driver.Checkpointer     = (*Driver)(nil)
)

// Defaults of Config fields left zero.
const (
	DefaultCgroupParent   = "/corral"
	DefaultPlatform       = "systrap"
	DefaultStartTimeout   = 10 * time.Second
	DefaultMemoryOverhead = 64 << 20
	DefaultPidsOverhead   = 256
)

// RunDest is where the directory holding the agent's socket appears
// inside every sandbox.
const RunDest = "/.corral/run"

// Files in a sandbox directory.
const (
	configFile = "config.json"
	logFile    = "agent.log"
	pidFile    = "sandbox.pid"
	runDir     = "run"
	socketFile = "agent.sock"
	// In runDir of sandboxes started by earlier versions, whose agents
	// read their limits and seccomp program from files: Delete removes
	// them.
	oldLimitsFile  = "limits"
	oldSeccompFile = "seccomp"
)

// Config configures a Driver.
type Config struct {
	// Root holds the driver's state: runsc's state (runsc --root) at
	// Root/state and one directory per sandbox at Root/sandboxes/<id>.
	// It must be an absolute path, short enough that
	// Root/sandboxes/<id>/run/agent.sock fits a unix socket address.
	Root string
	// RunscPath is the runsc binary; "runsc" from PATH when empty.
	RunscPath string
	// AgentPath is the host path of the static agent binary (the corral
	// binary itself), bind-mounted read-only into every sandbox.
	AgentPath string
	// CgroupParent is the cgroup under which each sandbox gets
	// <CgroupParent>/<id>; DefaultCgroupParent when empty.
	CgroupParent string
	// Platform is gVisor's platform (runsc --platform);
	// DefaultPlatform when empty.
	Platform string
	// Reaper, when set, is told about each sandbox's host processes (the
	// sandbox and the gofer) so that it reaps them when they exit. The
	// daemon must be a child subreaper (subreaper.SetSubreaper) for them to
	// become its children once runsc returns.
	Reaper *subreaper.Reaper
	// StartTimeout bounds Create and Restore; DefaultStartTimeout when
	// zero.
	StartTimeout time.Duration
	// OpenFiles is RLIMIT_NOFILE of every sandbox process, which gVisor
	// applies itself; runc.DefaultOpenFiles when zero.
	OpenFiles uint64
	// DenyIoctls are ioctl requests refused inside every sandbox besides
	// the built-in ones (seccomp.Options.DenyIoctls), as for runc.
	DenyIoctls []uint64
	// MemoryOverhead is added to a sandbox's memory limit in its host
	// cgroup for the Sentry, the gofer and the stub processes;
	// DefaultMemoryOverhead when zero.
	MemoryOverhead int64
	// PidsOverhead is added to a sandbox's host pids limit for the
	// Sentry's and the gofer's threads; DefaultPidsOverhead when zero.
	PidsOverhead int64
	// MountDir holds the sandboxes' boxes (see box.go): the agent socket
	// directories, and the bind mounts that the gofer of a sandbox with an
	// ID mapping opens. It is made mode 0711, and every directory above it
	// must be searchable by others. Default: DefaultMountDir/<hash of
	// Root>. Sockets there must fit a unix socket address.
	MountDir string
	// IDSlots is the host-wide table of host ID ranges shared with the
	// runc driver (runc.Driver.IDSlots): with it each sandbox of a
	// shifted template runs under a range of its own (ReserveIDs); nil
	// runs every sandbox in the stored range.
	IDSlots *runc.IDSlots
	// Logger receives lifecycle logs; nil discards them.
	Logger *slog.Logger
}

// Driver runs sandboxes in gVisor. Everything about a sandbox lives in Root,
// runsc's state and the host cgroup, except the listener for its agent,
// which New makes again for every sandbox directory it finds: a new Driver
// on the same Root takes over the sandboxes of a crashed daemon, and their
// agents reconnect within a second. Methods are safe for concurrent use
// on different IDs; the caller serializes calls for the same ID.
type Driver struct {
	cfg       Config
	host      runc.Host
	stateDir  string
	boxesDir  string
	cli       ocirt.CLI
	cgroupsV2 bool
	log       *slog.Logger

	mu        sync.Mutex
	listeners map[string]*agentdialout.Listener
	// stale holds the sandboxes checkpointed while paused: their agent
	// dials again when they resume (see Checkpoint).
	stale map[string]bool
}

// New checks cfg, fills in defaults, creates the directories under Root and
// listens for the agents of the sandboxes already there.
func New(cfg Config) (*Driver, error) {
	agent, runscPath, err := ocirt.Resolve("runsc", cfg.Root, cfg.AgentPath, cfg.RunscPath)
	if err != nil {
		return nil, err
	}
	cfg.AgentPath = agent
	cfg = withDefaults(cfg)
	v2, swap, err := ocirt.DetectCgroups()
	if err != nil {
		return nil, err
	}
	d := newDriver(cfg, runscPath, v2, swap)
	d.useSeccomp()
	for _, dir := range []string{d.stateDir, d.boxesDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating gvisor driver directory: %w", err)
		}
	}
	if err := ocirt.PrepareSearchableDir(cfg.MountDir); err != nil {
		return nil, err
	}
	if err := d.sweepIDs(); err != nil {
		return nil, err
	}
	if err := d.listenAll(); err != nil {
		return nil, err
	}
	return d, nil
}

// withDefaults returns cfg with its zero fields set to their defaults.
func withDefaults(cfg Config) Config {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.Platform == "" {
		cfg.Platform = DefaultPlatform
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.OpenFiles == 0 {
		cfg.OpenFiles = runc.DefaultOpenFiles
	}
	if cfg.MemoryOverhead <= 0 {
		cfg.MemoryOverhead = DefaultMemoryOverhead
	}
	if cfg.PidsOverhead <= 0 {
		cfg.PidsOverhead = DefaultPidsOverhead
	}
	if cfg.MountDir == "" {
		cfg.MountDir = MountDirFor(cfg.Root)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// newDriver makes the Driver of a complete cfg, on a host whose cgroup
// version and swap accounting are v2 and swap.
func newDriver(cfg Config, runscPath string, v2, swap bool) *Driver {
	d := &Driver{
		cfg:      cfg,
		stateDir: filepath.Join(cfg.Root, "state"),
		boxesDir: filepath.Join(cfg.Root, "sandboxes"),
		log:      cfg.Logger.With("driver", "gvisor"),
		host: runc.Host{
			AgentPath:      cfg.AgentPath,
			CgroupParent:   cfg.CgroupParent,
			CgroupV2:       v2,
			SwapAccounting: swap,
			Arch:           runtime.GOARCH,
			OpenFiles:      cfg.OpenFiles,
			DenyIoctls:     slices.Clone(cfg.DenyIoctls),
		},
		cgroupsV2: v2,
		listeners: make(map[string]*agentdialout.Listener),
		stale:     make(map[string]bool),
	}
	d.cli = ocirt.CLI{Name: "runsc", Path: runscPath, Root: d.stateDir, Flags: []string{
		"--platform=" + cfg.Platform,
		// Without it gVisor puts an overlay in its memory over the root
		// and the sandbox's writes never reach its copy-on-write root.
		"--overlay2=none",
		// The agent dials its socket on the host (see the package
		// documentation); the sandbox sees no other host socket.
		"--host-uds=open",
	}}
	return d
}

// useSeccomp has the agent install the seccomp filter inside gVisor,
// compiled once here, as it does under runc: runsc's --oci-seccomp would
// compile it again at every create. Where Corral cannot compile the
// profile, runsc applies the spec's.
func (d *Driver) useSeccomp() {
	prog, err := d.host.CompileSeccomp()
	if err != nil {
		d.log.Info("runsc applies the seccomp profile", "reason", err)
		d.cli.Flags = append(d.cli.Flags, "--oci-seccomp")
		return
	}
	d.host.InitSeccomp = prog
}

// listenAll starts the listeners for the agents of the sandboxes already
// under Root; when one fails it closes those it started.
func (d *Driver) listenAll() error {
	entries, err := os.ReadDir(d.boxesDir)
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, e := range entries {
		// A sandbox without its socket directory is half made: List
		// reports it and Delete removes it.
		if _, err := os.Stat(filepath.Join(d.box(e.Name()), runDir)); err != nil {
			continue
		}
		if _, err := d.listen(e.Name()); err != nil {
			d.Close()
			return err
		}
	}
	return nil
}

// Name returns "gvisor".
func (d *Driver) Name() string { return "gvisor" }

// Capabilities reports pause, checkpoint and gVisor isolation.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Pause: true, Checkpoint: true, Isolation: "gvisor"}
}

// Close stops listening for agents, and removes MountDir if no sandbox is
// left in it. Sandboxes keep running; their agents reconnect to the next
// Driver on the same Root.
func (d *Driver) Close() error {
	d.mu.Lock()
	ls := d.listeners
	d.listeners = make(map[string]*agentdialout.Listener)
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	_ = os.Remove(d.cfg.MountDir) // fails while boxes are in it
	return nil
}

func (d *Driver) dir(id string) string { return filepath.Join(d.boxesDir, id) }

func (d *Driver) cgroup(id string) ocirt.Cgroup {
	return ocirt.Cgroup{V2: d.cgroupsV2, Path: path.Join("/", d.cfg.CgroupParent, id)}
}

// listen starts the listener for sandbox id's agent. The socket is
// writable by everyone: only the sandbox's root can reach it (its box is
// mode 0700), which is an unprivileged host user with an ID mapping.
func (d *Driver) listen(id string) (*agentdialout.Listener, error) {
	sock := filepath.Join(d.box(id), runDir, socketFile)
	l, err := agentdialout.Listen(sock, d.log.With("sandbox_id", id))
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o777); err != nil {
		l.Close()
		return nil, fmt.Errorf("opening agent socket: %w", err)
	}
	d.mu.Lock()
	old := d.listeners[id]
	d.listeners[id] = l
	d.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return l, nil
}

func (d *Driver) listener(id string) *agentdialout.Listener {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.listeners[id]
}

func (d *Driver) closeListener(id string) {
	d.mu.Lock()
	l := d.listeners[id]
	delete(d.listeners, id)
	delete(d.stale, id)
	d.mu.Unlock()
	if l != nil {
		l.Close()
	}
}

// Delete kills the sandbox, has runsc forget it, removes its cgroup, its
// listener and its directory. It succeeds for unknown IDs and for every
// partial state a failed Create or a daemon crash can leave.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := driver.CheckID(id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	if err := d.destroy(ctx, id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	// After the sandbox is gone: its root's range is free only then.
	if err := d.releaseIDs(id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

// destroy is Delete without the error prefix.
//
// Killing the cgroup's processes from the host works whatever state the
// sandbox is in (paused included) and takes no runsc call; runsc delete
// then finds the sandbox stopped and only removes its state. It polls in
// 100 ms steps while the sandbox process is not yet reaped, so destroy
// waits for the reaper first.
func (d *Driver) destroy(ctx context.Context, id string) error {
	d.closeListener(id)
	cg := d.cgroup(id)
	// Watched already, unless runsc was killed before it returned.
	ours := d.children(id)
	d.watchProcesses(id)
	cg.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range ours {
		if d.cfg.Reaper != nil {
			ocirt.WaitGone(ctx, pid, time.Until(deadline))
		} else {
			ocirt.WaitExited(ctx, pid, time.Until(deadline))
		}
	}
	if _, err := d.cli.Run(ctx, nil, "delete", "--force", id); err != nil && !ocirt.IsNotExist(err) {
		return err
	}
	if err := cg.Remove(); err != nil {
		return err
	}
	// Before the sandbox directory: List must find a sandbox whose box
	// could not be removed.
	if err := d.removeBox(id); err != nil {
		return err
	}
	if err := os.RemoveAll(d.dir(id)); err != nil {
		return fmt.Errorf("removing sandbox directory: %w", err)
	}
	return nil
}

// Status asks runsc for the sandbox's state. A sandbox whose Sentry has
// exited (killed by the host's OOM killer, say) is stopped, also before
// the reaper collected it, when runsc still takes the zombie for running.
func (d *Driver) Status(ctx context.Context, id string) (driver.Status, error) {
	st, err := d.cli.State(ctx, id)
	if err != nil {
		return "", fmt.Errorf("reading state of sandbox %s: %w", id, err)
	}
	if st == driver.StatusRunning || st == driver.StatusPaused {
		if pid, err := ocirt.ReadPid(filepath.Join(d.dir(id), pidFile)); err == nil {
			if ocirt.Exited(pid) {
				return driver.StatusStopped, nil
			}
		}
	}
	return st, nil
}

// List returns the IDs that runsc knows or that have a sandbox directory,
// sorted: running sandboxes and the leftovers of interrupted creates and
// deletes.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	out, err := d.cli.Run(ctx, nil, "list", "-quiet")
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	ids, err := ocirt.ListDirs(d.boxesDir)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	ids = append(ids, strings.Fields(string(out))...)
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// DialAgent opens a stream to the sandbox's agent over its connection,
// waiting (bounded by ctx) for the agent to reconnect if it is not
// connected right now.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	l := d.listener(id)
	if l == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "dialing agent of %s: no such sandbox", id)
	}
	c, err := l.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dialing agent of %s: %w", id, err)
	}
	return c, nil
}

// Stats reads the sandbox's host cgroup: memory and CPU include gVisor's
// own (the Sentry, the gofer), which is what the host pays. Pids is the
// number of tasks inside gVisor, which the pids limit counts (innerPids).
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	s, err := ocirt.InstanceStats(id, d.cgroup)
	if err != nil {
		return s, err
	}
	s.Pids = d.innerPids(ctx, id)
	return s, nil
}

// OOMKills reads the OOM-kill count of instance id's cgroup.
func (d *Driver) OOMKills(ctx context.Context, id string) (int64, error) {
	return ocirt.InstanceOOMKills(id, d.cgroup)
}

// Pause stops every task of the sandbox inside gVisor.
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.simple(ctx, "pausing", id, "pause")
}

// Resume continues a paused sandbox, and has its agent dial again if the
// sandbox was checkpointed while paused.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := d.simple(ctx, "resuming", id, "resume"); err != nil {
		return err
	}
	d.mu.Lock()
	stale := d.stale[id]
	delete(d.stale, id)
	d.mu.Unlock()
	if stale {
		if err := d.redial(ctx, id); err != nil {
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	}
	return nil
}

func (d *Driver) simple(ctx context.Context, doing, id, verb string) error {
	if err := d.cli.Do(ctx, verb, id); err != nil {
		return fmt.Errorf("%s sandbox %s: %w", doing, id, err)
	}
	return nil
}

// PrepareTemplate creates the mount points of the agent binary and of its
// socket directory in a new template tree, so that starting a sandbox
// writes nothing into its copy-on-write root.
func (d *Driver) PrepareTemplate(dir string) error {
	return ocirt.MakeMountPoints(dir, []string{runc.AgentDest}, []string{RunDest})
}
