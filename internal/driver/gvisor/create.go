package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/agentdialout"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

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
	var u undo.Stack
	defer ocirt.UndoFailed(ctx, &u, &err, filepath.Join(dir, logFile), doing+" sandbox "+id)
	u.Add(func(ctx context.Context) error { return d.destroy(ctx, id) })

	if err := checkRoot(id, spec.RootFS); err != nil {
		return err
	}
	l, err := d.writeBundle(id, dir, spec, image)
	if err != nil {
		return err
	}
	// runsc itself is not interrupted when the caller gives up: killing
	// it midway leaves its sandbox and gofer behind, unreaped. Only a hung
	// runsc is killed, at StartTimeout; destroy then cleans up.
	runCtx, cancelRun := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StartTimeout)
	defer cancelRun()
	bundled := time.Now()
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
	// The host cgroup's CPU quota, which the boot ran without
	// (makeCgroup), before anything the sandbox asks for runs: a new
	// sandbox's agent starts nothing until it is asked to. Memory and
	// pids are written again with the values they have.
	if _, err := d.setCgroup(d.cgroup(id), spec.Resources); err != nil {
		return err
	}
	d.log.Debug(doing+" sandbox", "sandbox_id", id, "pid", pid,
		"duration_ms", time.Since(began).Milliseconds(), "bundle_ms", bundled.Sub(began).Milliseconds(),
		"runsc_ms", ran.Sub(bundled).Milliseconds(), "agent_ms", connected.Sub(ran).Milliseconds())
	return nil
}

// checkRoot fails with ErrInvalidArgument unless rootfs is a directory:
// runsc's own error for a missing root says nothing of it.
func checkRoot(id, rootfs string) error {
	fi, err := os.Stat(rootfs)
	if err == nil && fi.IsDir() {
		return nil
	}
	// The reason without the path, which is the host's.
	reason := "not a directory"
	var pe *fs.PathError
	if errors.As(err, &pe) {
		reason = pe.Err.Error()
	}
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "root file system of sandbox %s: %s", id, reason)
}

// writeBundle makes everything runsc reads to start sandbox id: its box,
// the listener for its agent, its host cgroup, the files the agent reads
// and the OCI config in dir, with the checkpointed argv when restoring
// image. It returns the agent's listener.
func (d *Driver) writeBundle(id, dir string, spec driver.Spec, image string) (*agentdialout.Listener, error) {
	userns, err := runc.RootUserNS(spec.RootFS)
	if err != nil {
		return nil, err
	}
	boxed, host, err := d.makeBox(id, spec, userns)
	if err != nil {
		return nil, err
	}
	l, err := d.listen(id)
	if err != nil {
		return nil, err
	}
	if err := d.makeCgroup(id, spec.Resources); err != nil {
		return nil, err
	}
	oci := ociSpec(boxed, host, userns, filepath.Join(d.box(id), runDir))
	// The Sentry applies a mount's flags from the spec alone: without
	// them a host mount's noexec or read-only flag would not hold inside.
	if err := runc.KeepLockedFlags(oci, boxed.Mounts); err != nil {
		return nil, err
	}
	if image != "" {
		// runsc restores only with the argv the image was taken with.
		if oci.Process.Args, err = checkpointedArgs(image, oci.Process.Args); err != nil {
			return nil, err
		}
	}
	config, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), config, 0o600); err != nil {
		return nil, err
	}
	return l, nil
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
		// A sandbox restored from another's checkpoint runs under a host
		// ID range of its own (ReserveIDs), and runsc's default
		// validation refuses any change of the spec's uid mapping. The
		// mapping is host-side only (the Sentry sees the sandbox's own
		// IDs either way); the rest of the spec is this driver's in both
		// sandboxes (ociSpec), so runsc only logs the differences.
		args = []string{network, "--restore-spec-validation=warning", "restore", "--detach", "--image-path", image, "--pid-file", pidPath, "--bundle", dir, id}
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
func waitAgent(ctx context.Context, l *agentdialout.Listener, pid int) error {
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
