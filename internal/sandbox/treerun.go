package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// TreeSpec says where RunOnTree runs a command.
type TreeSpec struct {
	// Root is the absolute host path of a directory tree that becomes
	// the sandbox's writable root file system as it is: no template, no
	// copy-on-write layer. What the command changes stays in it.
	Root string
	// Runtime names the driver; empty means the Manager's default.
	Runtime string
	// Limits are the sandbox's resource limits; zero fields take the
	// Manager's defaults, and all are bounded by its maximums. A disk
	// limit is refused: Root is not storage the Manager made.
	Limits Limits
	// Network is what the process may reach; the zero value is mode none
	// (loopback only). Other modes need the Manager's network support.
	Network egress.Policy
}

// RunOnTree runs one process in a transient sandbox whose root is the
// directory spec.Root, calls fn for each event of its stream (as Exec
// does), and deletes the sandbox when the process has exited. It serves
// image builds, whose RUN steps change a directory that is then kept as
// the step's result.
//
// The sandbox is not recorded, listed or timed out: it lives exactly as
// long as the call, and canceling ctx kills the process and deletes it. A
// daemon that dies meanwhile leaves an instance (and a network) that no
// record names, which the next start deletes (reconcile). Before it
// starts, the driver prepares Root as it prepares a new template (runc:
// its mount point, and with user namespaces owners shifted into the
// sandbox range, so that root in the process is not root on the host);
// Root is then in the form CreateTemplate would give it anyway.
//
// A process that cannot start returns the agent's error; a process that
// runs returns nil whatever its exit status, which fn sees in the exit
// event. When the sandbox cannot be deleted afterwards the error says so:
// Root may then still be in use and must not be kept.
//
// Cost: a sandbox create and delete, and the driver's preparation, which
// with user namespaces walks every file of Root.
func (m *Manager) RunOnTree(ctx context.Context, spec TreeSpec, req wire.ExecRequest, fn func(wire.ExecEvent) error) (err error) {
	if !filepath.IsAbs(spec.Root) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "tree root %q is not an absolute path", spec.Root)
	}
	rt := spec.Runtime
	if rt == "" {
		rt = m.cfg.DefaultRuntime
	}
	drv, ok := m.drivers[rt]
	if !ok {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown runtime %q (available: %s)", rt, strings.Join(m.runtimeNames(), ", "))
	}
	if spec.Limits.DiskBytes != 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a sandbox on a directory tree cannot have a disk limit")
	}
	lim, err := m.bound(spec.Limits)
	if err != nil {
		return err
	}
	policy, err := m.resolvePolicy(spec.Network, egress.ModeNone, egress.Policy{})
	if err != nil {
		return err
	}
	if p, ok := drv.(driver.TemplatePreparer); ok {
		if err := p.PrepareTemplate(spec.Root); err != nil {
			return fmt.Errorf("preparing %s for %s: %w", spec.Root, rt, err)
		}
	}
	id := newID()
	start := time.Now()
	netSpec, err := m.setupNetwork(ctx, Sandbox{ID: id, Network: policy})
	if err != nil {
		return fmt.Errorf("creating network of sandbox on %s: %w", spec.Root, err)
	}
	if netSpec != nil {
		// Torn down in the background, as for a deleted sandbox: a build
		// step need not wait for it.
		defer m.releaseNetworkLater(id)
		// Under the request's own variables, as withNetworkEnv does.
		env := map[string]string{}
		for _, kv := range netSpec.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		maps.Copy(env, req.Env)
		req.Env = env
	}
	err = drv.Create(ctx, driver.Spec{
		ID:       id,
		RootFS:   spec.Root,
		Hostname: id,
		Resources: driver.Resources{
			MilliCPUs:   lim.MilliCPUs,
			MemoryBytes: lim.MemoryBytes,
			Pids:        lim.Pids,
		},
		Network: netSpec,
	})
	if err != nil {
		return fmt.Errorf("starting sandbox on %s: %w", spec.Root, err)
	}
	client := m.newAgent(drv, id)
	defer func() {
		client.Close()
		// Deleted even when ctx is canceled: the process must be gone
		// before the caller keeps or removes the tree.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if derr := drv.Delete(dctx, id); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting sandbox %s on %s: %w", id, spec.Root, derr))
		}
		m.log.Debug("ran on tree", "sandbox_id", id, "runtime", rt, "root", spec.Root,
			"duration_ms", time.Since(start).Milliseconds())
	}()
	return client.Exec(ctx, req, fn)
}
