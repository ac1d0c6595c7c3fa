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
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// maxSocketPath is the longest path a unix socket address can hold
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

// MakeSandboxDir checks a new sandbox (its ID, an absolute root file
// system, an agent socket path sock that fits a unix socket address) and
// creates its directory dir, failing with ErrAlreadyExists when dir
// exists. Errors name no operation; the caller adds it.
func MakeSandboxDir(id, rootfs, dir, sock string) error {
	if err := CheckID(id); err != nil {
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

// CleanUpFailed is deferred by a create that may fail after it made the
// sandbox's directory: when *errp is set, it undoes everything with
// destroy, which must handle every partial state, under a context of its
// own (the caller's may be what ended), and adds destroy's error and the
// end of the log at logPath (the agent's and the runtime's output) to
// *errp.
func CleanUpFailed(ctx context.Context, errp *error, logPath string, destroy func(context.Context) error) {
	if *errp == nil {
		return
	}
	tail := ReadTail(logPath, logTail)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := destroy(ctx); err != nil {
		*errp = errors.Join(*errp, fmt.Errorf("cleaning up: %w", err))
	}
	if tail != "" {
		*errp = fmt.Errorf("%w\n%s:\n%s", *errp, filepath.Base(logPath), tail)
	}
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
	if err := CheckID(id); err != nil {
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
	if err := CheckID(id); err != nil {
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
