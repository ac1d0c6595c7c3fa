package gvisor

import (
	"context"
	"encoding/json"
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
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corralrun/corral/internal/agentconn"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/reaper"
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
	configFile  = "config.json"
	logFile     = "agent.log"
	pidFile     = "sandbox.pid"
	runDir      = "run"
	socketFile  = "agent.sock"
	limitsFile  = "limits"  // in runDir, read by the agent (agentd --limits)
	seccompFile = "seccomp" // in runDir, read by the agent (agentd --seccomp-file)
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
	// daemon must be a child subreaper (reaper.SetSubreaper) for them to
	// become its children once runsc returns.
	Reaper *reaper.Reaper
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
	listeners map[string]*agentconn.Listener
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
	v2, swap, err := ocirt.DetectCgroups()
	if err != nil {
		return nil, err
	}
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
		listeners: make(map[string]*agentconn.Listener),
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
		// The Sentry sizes GOMAXPROCS, and so its threads and every stub
		// process's, by the CPU quota instead of the host's CPUs.
		"--cpu-num-from-quota",
	}}
	// The agent installs the seccomp filter inside gVisor, compiled once
	// here, as it does under runc: runsc's --oci-seccomp costs about 30
	// ms of every create (docs/BENCHMARKS.md). Where Corral cannot
	// compile the profile, runsc applies the spec's.
	if prog, err := d.host.CompileSeccomp(); err == nil {
		d.host.InitSeccomp = prog
	} else {
		d.log.Info("runsc applies the seccomp profile", "reason", err)
		d.cli.Flags = append(d.cli.Flags, "--oci-seccomp")
	}
	for _, dir := range []string{d.stateDir, d.boxesDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating gvisor driver directory: %w", err)
		}
	}
	if err := ocirt.PrepareSearchableDir(cfg.MountDir); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(d.boxesDir)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, e := range entries {
		// A sandbox without its socket directory is half made: List
		// reports it and Delete removes it.
		if _, err := os.Stat(filepath.Join(d.box(e.Name()), runDir)); err != nil {
			continue
		}
		if _, err := d.listen(e.Name()); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
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
	d.listeners = make(map[string]*agentconn.Listener)
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
func (d *Driver) listen(id string) (*agentconn.Listener, error) {
	sock := filepath.Join(d.box(id), runDir, socketFile)
	l, err := agentconn.Listen(sock, d.log.With("sandbox_id", id))
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

func (d *Driver) listener(id string) *agentconn.Listener {
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

// Create writes the sandbox's OCI bundle and host cgroup, starts it with
// one `runsc run --detach`, and returns when the agent has connected and
// the sandbox's limits are set inside gVisor. It fails with
// ErrAlreadyExists when the ID is in use. On any failure it removes
// everything it made and returns an error that carries the end of the
// agent's and runsc's output.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) error {
	return d.start(ctx, spec, "")
}

// Restore starts sandbox id from the checkpoint image in dir, as Create
// does with spec: its own bundle, root, cgroup and agent socket. The
// restored agent finds its old connection gone and dials the new socket.
// gVisor requires the spec to match the checkpointed one in what the
// sandbox's state depends on (mounts, namespaces), which it does for two
// sandboxes of this driver.
func (d *Driver) Restore(ctx context.Context, id string, spec driver.Spec, dir string) error {
	if spec.ID != "" && spec.ID != id {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "restoring sandbox %s: spec names sandbox %s", id, spec.ID)
	}
	spec.ID = id
	if !filepath.IsAbs(dir) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "restoring sandbox %s: image directory %q is not an absolute path", id, dir)
	}
	return d.start(ctx, spec, dir)
}

// start is Create, or Restore when image is set.
func (d *Driver) start(ctx context.Context, spec driver.Spec, image string) (err error) {
	id := spec.ID
	doing := "creating"
	if image != "" {
		doing = "restoring"
	}
	dir := d.dir(id)
	if err := ocirt.MakeSandboxDir(id, spec.RootFS, dir, filepath.Join(d.box(id), runDir, socketFile)); err != nil {
		return fmt.Errorf("%s sandbox %s: %w", doing, id, err)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()

	// From here on, a failure undoes everything through destroy, which
	// handles every partial state from "directory only" to "running".
	defer func() {
		ocirt.CleanUpFailed(ctx, &err, filepath.Join(dir, logFile), func(ctx context.Context) error { return d.destroy(ctx, id) })
		if err != nil {
			err = fmt.Errorf("%s sandbox %s: %w", doing, id, err)
		}
	}()
	// runsc's own error for a missing root says nothing of it.
	if fi, err := os.Stat(spec.RootFS); err != nil || !fi.IsDir() {
		// The reason without the path, which is the host's.
		reason := "not a directory"
		var pe *fs.PathError
		if errors.As(err, &pe) {
			reason = pe.Err.Error()
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "root file system of sandbox %s: %s", id, reason)
	}

	userns, err := runc.RootUserNS(spec.RootFS)
	if err != nil {
		return err
	}
	boxed, host, err := d.makeBox(id, spec, userns)
	if err != nil {
		return err
	}
	l, err := d.listen(id)
	if err != nil {
		return err
	}
	if err := d.makeCgroup(id, spec.Resources); err != nil {
		return err
	}
	// A new agent writes the limits inside gVisor before it serves. A
	// restored one does not start again: its limits are written through
	// it below. The file is there either way, for the spec (which names
	// it) to be the checkpointed one's.
	if err := writeLimitsFile(filepath.Join(d.box(id), runDir, limitsFile), innerLimitFiles(spec.Resources, false)); err != nil {
		return err
	}
	if host.InitSeccomp != "" {
		if err := os.WriteFile(filepath.Join(d.box(id), runDir, seccompFile), []byte(host.InitSeccomp), 0o444); err != nil {
			return fmt.Errorf("writing the seccomp program for the agent: %w", err)
		}
	}
	oci := ociSpec(boxed, host, userns, filepath.Join(d.box(id), runDir))
	if image != "" {
		// runsc restores only with the argv the image was taken with.
		if oci.Process.Args, err = checkpointedArgs(image, oci.Process.Args); err != nil {
			return err
		}
	}
	config, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), config, 0o600); err != nil {
		return err
	}
	// runsc itself is not interrupted when the caller gives up: killing
	// it midway leaves its sandbox and gofer behind, unreaped. Only a hung
	// runsc is killed, at StartTimeout; destroy then cleans up.
	runCtx, cancelRun := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StartTimeout)
	defer cancelRun()
	pid, err := d.run(runCtx, id, dir, image, spec.Network != nil)
	if err != nil {
		return err
	}
	d.watchProcesses(id)
	ran := time.Now()
	if err := waitAgent(ctx, l, pid); err != nil {
		return err
	}
	connected := time.Now()
	if image != "" {
		if err := d.setInnerLimits(ctx, id, spec.Resources, false); err != nil {
			return err
		}
	}
	d.log.Debug(doing+" sandbox", "sandbox_id", id, "pid", pid,
		"duration_ms", time.Since(began).Milliseconds(), "runsc_ms", ran.Sub(began).Milliseconds(),
		"agent_ms", connected.Sub(ran).Milliseconds())
	return nil
}

// run starts the sandbox with `runsc run --detach`, or `runsc restore
// --detach` from image, and returns the sandbox process's pid. runsc passes
// its standard output and error through to the agent, so the agent's
// output and runsc's own errors both land in agent.log.
func (d *Driver) run(ctx context.Context, id, dir, image string, networked bool) (int, error) {
	// gVisor's netstack serves the namespace's interfaces; without a
	// prepared namespace the sandbox has loopback only.
	network := "--network=none"
	if networked {
		network = "--network=sandbox"
	}
	pidPath := filepath.Join(dir, pidFile)
	args := []string{network, "run", "--detach", "--pid-file", pidPath, "--bundle", dir, id}
	if image != "" {
		args = []string{network, "restore", "--detach", "--image-path", image, "--pid-file", pidPath, "--bundle", dir, id}
	}
	if err := ocirt.RunLogged(ctx, d.cli.Command(ctx, args...), filepath.Join(dir, logFile)); err != nil {
		return 0, fmt.Errorf("running runsc: %w", err)
	}
	pid, err := ocirt.ReadPid(pidPath)
	if err != nil {
		return 0, fmt.Errorf("reading sandbox pid: %w", err)
	}
	return pid, nil
}

// watchProcesses hands sandbox id's children (see children) to the
// reaper.
func (d *Driver) watchProcesses(id string) {
	if d.cfg.Reaper == nil {
		return
	}
	for _, pid := range d.children(id) {
		d.cfg.Reaper.Watch(pid)
	}
}

// children returns the host processes of sandbox id that are children of
// this process: the sandbox and the gofer, which reparent to the daemon
// when runsc exits, alive or exited but not reaped. They are found in the
// sandbox's cgroup, and through runsc's records of their pids, which find
// them also once they died: an exited process leaves its cgroup.
func (d *Driver) children(id string) []int {
	cands, _ := d.cgroup(id).Procs()
	if pid, err := ocirt.ReadPid(filepath.Join(d.dir(id), pidFile)); err == nil {
		cands = append(cands, pid)
	}
	cands = append(cands, d.goferPid(id))
	slices.Sort(cands)
	self := os.Getpid()
	var out []int
	for _, pid := range slices.Compact(cands) {
		if pid > 0 && ocirt.ParentPid(pid) == self {
			out = append(out, pid)
		}
	}
	return out
}

// goferPid reads the gofer's pid from runsc's state file of sandbox id,
// <state>/<id>_sandbox:<id>.state, a JSON document; 0 if unknown.
func (d *Driver) goferPid(id string) int {
	b, err := os.ReadFile(filepath.Join(d.stateDir, id+"_sandbox:"+id+".state"))
	if err != nil {
		return 0
	}
	var st struct {
		GoferPid int `json:"goferPid"`
	}
	_ = json.Unmarshal(b, &st)
	return st.GoferPid
}

// errSandboxExited is why a wait for the agent ends early.
var errSandboxExited = errors.New("the sandbox exited before its agent connected")

// waitAgent waits until the agent has connected to l, or the sandbox
// process pid has exited, or ctx ends.
func waitAgent(ctx context.Context, l *agentconn.Listener, pid int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if ocirt.Exited(pid) {
					cancel(errSandboxExited)
					return
				}
			}
		}
	})
	err := l.WaitConnected(ctx)
	close(stop)
	wg.Wait()
	if err != nil && errors.Is(context.Cause(ctx), errSandboxExited) {
		return errSandboxExited
	}
	return err
}

// Delete kills the sandbox, has runsc forget it, removes its cgroup, its
// listener and its directory. It succeeds for unknown IDs and for every
// partial state a failed Create or a daemon crash can leave.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := ocirt.CheckID(id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	if err := d.destroy(ctx, id); err != nil {
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

// Update replaces the sandbox's CPU, memory and pids limits, in its host
// cgroup (with the overheads) and then inside gVisor, all or nothing: when
// the limits inside cannot be set, the host cgroup's are put back. Zero
// fields lift a limit. It writes the cgroup itself rather than through
// `runsc update`, which leaves alone a cgroup it did not make and knows
// nothing of the limits inside.
func (d *Driver) Update(ctx context.Context, id string, r driver.Resources) error {
	if err := ocirt.CheckID(id); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	cg := d.cgroup(id)
	if err := cg.Exists(); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	undo, err := d.setCgroup(cg, r)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	if err := d.setInnerLimits(ctx, id, r, true); err != nil {
		if uerr := undo(); uerr != nil {
			err = fmt.Errorf("%w; restoring the host cgroup's limits: %w", err, uerr)
		}
		return fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	return nil
}

// Checkpoint saves the sandbox's memory and kernel state into dir with
// `runsc checkpoint`; see driver.Checkpointer. Without leaveRunning the
// sandbox exits once saved.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	if err := ocirt.CheckID(id); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	if !filepath.IsAbs(dir) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "checkpointing sandbox %s: image directory %q is not an absolute path", id, dir)
	}
	// The record first: once runsc has saved the sandbox, nothing may
	// fail before the agent is reconnected below.
	if err := d.recordArgs(id, dir); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	args := []string{"checkpoint", "--image-path", dir}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	if _, err := d.cli.Run(ctx, nil, append(args, id)...); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, ocirt.Classify(err))
	}
	if !leaveRunning {
		if err := d.waitStopped(ctx, id); err != nil {
			return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
		}
		return nil
	}
	err := d.redial(ctx, id)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		// Paused: the agent can dial only once it runs again.
		d.mu.Lock()
		d.stale[id] = true
		d.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	return nil
}

// waitStopped waits until sandbox id's process has exited: runsc
// checkpoint returns once the image is saved, and the sandbox exits just
// after, which a Status call in between did not see (CI found it).
func (d *Driver) waitStopped(ctx context.Context, id string) error {
	pid, err := ocirt.ReadPid(filepath.Join(d.dir(id), pidFile))
	if err != nil {
		return err
	}
	ocirt.WaitExited(ctx, pid, d.cfg.StartTimeout)
	switch {
	case ocirt.Exited(pid):
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return errdefs.Errorf(errdefs.ErrUnavailable, "the sandbox still runs %v after its checkpoint", d.cfg.StartTimeout)
	}
}

// argsFile, in a checkpoint image, holds the argv (JSON) of the agent the
// image holds, which restoring it must give runsc again.
const argsFile = "corral-agent-args.json"

// recordArgs writes the argv of sandbox id's agent, from its bundle, into
// the checkpoint image directory dir, which must exist.
func (d *Driver) recordArgs(id, dir string) error {
	b, err := os.ReadFile(filepath.Join(d.dir(id), configFile))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrNotFound, "no sandbox %s", id)
	}
	if err != nil {
		return fmt.Errorf("reading the sandbox's bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("reading the sandbox's bundle: %w", err)
	}
	if spec.Process == nil {
		return errors.New("reading the sandbox's bundle: it has no process")
	}
	args, err := json.Marshal(spec.Process.Args)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, argsFile), args, 0o600)
}

// checkpointedArgs returns the agent's argv that the checkpoint image in
// dir was taken with, given args, the argv of a new sandbox. An image
// records it (argsFile); one from before the record is also from before
// spawnThreadFlag and has args without that flag. A recorded argv must be
// one of those two: an image cannot make the sandbox's init anything but
// an agent this driver starts.
func checkpointedArgs(dir string, args []string) ([]string, error) {
	legacy := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == spawnThreadFlag })
	b, err := os.ReadFile(filepath.Join(dir, argsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return legacy, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint's agent command line: %w", err)
	}
	var recorded []string
	if err := json.Unmarshal(b, &recorded); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "checkpoint image: bad agent command line in %s: %v", argsFile, err)
	}
	if !slices.Equal(recorded, args) && !slices.Equal(recorded, legacy) {
		// The command line names host paths (the agent binary), so the
		// message does not quote it.
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "checkpoint image: taken with an agent command line that this version does not start")
	}
	return recorded, nil
}

// redial replaces the agent's connection after a checkpoint: gVisor does
// not keep host socket connections across a save, and neither end of the
// agent's connection notices before the next keep-alive, seconds later.
// SIGHUP makes the agent dial again; the stale session is dropped first so
// that nothing uses it meanwhile. A paused sandbox fails with
// ErrFailedPrecondition.
func (d *Driver) redial(ctx context.Context, id string) error {
	l := d.listener(id)
	if l == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "reconnecting the agent of %s: no listener", id)
	}
	l.Drop()
	if _, err := d.cli.Run(ctx, nil, "kill", id, "HUP"); err != nil {
		return fmt.Errorf("reconnecting the agent: %w", ocirt.Classify(err))
	}
	if err := l.WaitConnected(ctx); err != nil {
		return fmt.Errorf("reconnecting the agent: %w", err)
	}
	return nil
}

// PrepareTemplate creates the mount points of the agent binary and of its
// socket directory in a new template tree, so that starting a sandbox
// writes nothing into its copy-on-write root.
func (d *Driver) PrepareTemplate(dir string) error {
	return ocirt.MakeMountPoints(dir, []string{runc.AgentDest}, []string{RunDest})
}
