package ocirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

// maxSocketPath is the longest path a unix socket address can hold
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

// MakeSandboxDir checks a new sandbox (its ID, an absolute root file
// system, an agent socket path sock that fits a unix socket address) and
// creates its directory dir, failing with ErrAlreadyExists when dir
// exists. Errors name no operation; the caller adds it.
func MakeSandboxDir(id, rootfs, dir, sock string) error {
	if err := driver.CheckID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(rootfs) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "root file system %q is not an absolute path", rootfs)
	}
	if len(sock) > maxSocketPath {
		return fmt.Errorf("socket path %s is too long", sock)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "sandbox directory exists")
		}
		return err
	}
	return nil
}

// logTail is how much of a sandbox's log a failed create reports.
const logTail = 2048

// UndoFailed is deferred by a create that registered on u the releases of
// what it made, the first of them one that handles every partial state of
// the sandbox's directory: when *errp is set, it runs them (u.OnError),
// adds the end of the log at logPath (the agent's and the runtime's
// output), read before the releases since they remove the directory that
// holds it, and prefixes *errp with doing. When *errp is nil it drops the
// releases.
func UndoFailed(ctx context.Context, u *undo.Stack, errp *error, logPath, doing string) {
	if *errp == nil {
		u.Keep()
		return
	}
	tail := ReadTail(logPath, logTail)
	u.OnError(ctx, errp)
	if tail != "" {
		*errp = fmt.Errorf("%w\n%s:\n%s", *errp, filepath.Base(logPath), tail)
	}
	*errp = fmt.Errorf("%s: %w", doing, *errp)
}

// RunLogged runs cmd, a runtime command that starts a sandbox, with
// /dev/null as its standard input and its output appended to logPath:
// runtimes pass their stdio through to the sandbox's init, so the
// agent's output and the runtime's own errors both land there. When ctx
// ended the error says so.
func RunLogged(ctx context.Context, cmd *exec.Cmd, logPath string) error {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	cmd.Stdin = null
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return err
	}
	return nil
}

// State asks the runtime for the state of container id. A container whose
// init has exited and one that was created but never started are both
// stopped; an unknown one is StatusUnknown with a nil error.
func (c CLI) State(ctx context.Context, id string) (driver.Status, error) {
	if err := driver.CheckID(id); err != nil {
		return driver.StatusUnknown, nil
	}
	out, err := c.Run(ctx, nil, "state", id)
	if err != nil {
		if IsNotExist(err) {
			return driver.StatusUnknown, nil
		}
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", err
	}
	switch st.Status {
	case "running":
		return driver.StatusRunning, nil
	case "paused", "pausing":
		return driver.StatusPaused, nil
	case "created", "stopped":
		return driver.StatusStopped, nil
	}
	return "", fmt.Errorf("unexpected %s status %q", c.Name, st.Status)
}

// Do runs `<runtime> verb id` (pause, resume) and returns its error with
// the errdefs kind that matches the runtime's message.
func (c CLI) Do(ctx context.Context, verb, id string) error {
	if err := driver.CheckID(id); err != nil {
		return err
	}
	if _, err := c.Run(ctx, nil, verb, id); err != nil {
		return Classify(err)
	}
	return nil
}

// ListDirs returns the names of the directories in dirs, sorted and
// without repeats.
func ListDirs(dirs ...string) ([]string, error) {
	var ids []string
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// Resolve checks the configuration every OCI driver shares: root, its
// state directory, must be absolute; agentPath, the agent binary, must
// exist (it is returned absolute); and the runtime binary runtimePath
// (name from PATH when empty) must be found.
func Resolve(name, root, agentPath, runtimePath string) (agent, runtime string, err error) {
	if !filepath.IsAbs(root) {
		return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "driver root %q is not an absolute path", root)
	}
	if agentPath == "" {
		return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "driver needs an agent path")
	}
	if agent, err = filepath.Abs(agentPath); err != nil {
		return "", "", fmt.Errorf("resolving agent path: %w", err)
	}
	if _, err := os.Stat(agent); err != nil {
		return "", "", fmt.Errorf("checking agent binary: %w", err)
	}
	if runtimePath == "" {
		runtimePath = name
	}
	if runtime, err = exec.LookPath(runtimePath); err != nil {
		return "", "", fmt.Errorf("finding %s: %w", name, err)
	}
	return agent, runtime, nil
}
