package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
)

// Checkpoint saves the sandbox's memory and kernel state into dir with
// `runsc checkpoint`; see driver.Checkpointer. Without leaveRunning the
// sandbox exits once saved.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	if err := driver.CheckID(id); err != nil {
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
// after, so a Status call in between would still see it running.
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
// records it (argsFile); one from before the record has the argv of an
// agent from before spawnThreadFlag (earlierArgs). A recorded argv must be
// one this driver has started: an image cannot make the sandbox's init
// anything but an agent.
func checkpointedArgs(dir string, args []string) ([]string, error) {
	files, first := earlierArgs(args)
	b, err := os.ReadFile(filepath.Join(dir, argsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return first, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint's agent command line: %w", err)
	}
	var recorded []string
	if err := json.Unmarshal(b, &recorded); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "checkpoint image: bad agent command line in %s: %v", argsFile, err)
	}
	if !slices.Equal(recorded, args) && !slices.Equal(recorded, files) && !slices.Equal(recorded, first) {
		// The command line names host paths (the agent binary), so the
		// message does not quote it.
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "checkpoint image: taken with an agent command line that this version does not start")
	}
	return recorded, nil
}

// earlierArgs are the argvs that earlier versions of this driver gave the
// agent of a sandbox whose argv is now args, which images taken then
// hold: files, of agents that read their limits and seccomp program from
// files in the run directory, and first, files without spawnThreadFlag.
func earlierArgs(args []string) (files, first []string) {
	for _, a := range args {
		switch {
		case a == "--limits-env="+limitsEnv:
			files = append(files, "--limits="+path.Join(RunDest, oldLimitsFile))
		case a == "--seccomp-env="+seccompEnv:
			files = append(files, "--seccomp-file="+path.Join(RunDest, oldSeccompFile))
		default:
			files = append(files, a)
		}
	}
	first = slices.DeleteFunc(slices.Clone(files), func(a string) bool { return a == spawnThreadFlag })
	return files, first
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
