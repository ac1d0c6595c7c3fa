package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/internal/ocirt"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/undo"
)

// Create writes the sandbox's OCI bundle, starts its init (the agent) with
// one `runc run --detach`, and returns when the agent reports ready on its
// pipe. It fails with ErrAlreadyExists when the ID is in use. On any
// failure it removes everything it made and returns an error that carries
// the end of the agent's and runc's output.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (err error) {
	id := spec.ID
	dir := d.dir(id)
	sock := filepath.Join(dir, socketFile)
	if driver.CheckID(id) == nil {
		if _, err := os.Stat(filepath.Join(d.stateDir, id)); err == nil {
			return errdefs.Errorf(errdefs.ErrAlreadyExists, "creating container %s: runc already has a container with this id", id)
		}
	}
	// ReserveIDs made the directory of a sandbox with a range of its own.
	reserved := d.reserved.take(id)
	if err := ocirt.MakeSandboxDir(id, spec.RootFS, dir, sock); err != nil && (reserved == nil || !errors.Is(err, errdefs.ErrAlreadyExists)) {
		if reserved != nil {
			reserved.Close()
		}
		return fmt.Errorf("creating container %s: %w", id, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()

	// From here on, a failure undoes everything through destroy, which
	// handles every partial state from "directory only" to "running".
	var u undo.Stack
	defer ocirt.UndoFailed(ctx, &u, &err, filepath.Join(dir, logFile), "creating container "+id)
	u.Add(func(ctx context.Context) error { return d.destroy(ctx, id) })

	userns, ns, err := d.userNSFor(ctx, dir, &spec, reserved)
	if err != nil {
		return err
	}
	if ns != nil {
		// runc joins the namespace by path; the holder must stay
		// unreaped until `runc run` has returned.
		defer ns.Close()
	}
	pid, ready, err := d.runBundle(ctx, dir, sock, spec, userns)
	if err != nil {
		return err
	}
	defer ready.Close()
	if ns != nil {
		// runc has joined the namespace: reaping the holder now overlaps
		// the agent's start instead of following it.
		ns.Close()
	}
	if d.cfg.Reaper != nil {
		d.cfg.Reaper.Watch(pid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("waiting for the agent: %w", err)
	}
	ranRunc := time.Now()
	if err := waitReady(ctx, ready); err != nil {
		return err
	}
	d.log.Debug("created container", "sandbox_id", id, "pid", pid,
		"duration_ms", time.Since(start).Milliseconds(), "runc_ms", ranRunc.Sub(start).Milliseconds())
	return nil
}

// userNSFor gives the sandbox of spec a user namespace when its template
// was built with shifted owners: reserved, the one ReserveIDs made in the
// sandbox's slot, or a new one in a free slot that runs in the stored
// range, with the root bind-mounted where runc reads it (spec.RootFS is
// changed to that path). The caller closes the returned holder once runc
// has joined its namespace; on error nothing needs closing. Without a
// shifted template it returns a zero UserNS and a nil holder.
func (d *Driver) userNSFor(ctx context.Context, dir string, spec *driver.Spec, reserved *userNS) (_ UserNS, _ *userNS, err error) {
	var u undo.Stack
	defer u.OnError(ctx, &err)
	if reserved != nil {
		u.Add(func(context.Context) error { reserved.Close(); return nil })
	}
	base, useNS, err := rootBase(spec.RootFS)
	if err != nil {
		return UserNS{}, nil, err
	}
	if !useNS {
		if d.cfg.UserNamespaces {
			d.log.Warn("template was built without user namespace support: sandbox root is host root (rebuild the template)", "sandbox_id", spec.ID)
		}
		if reserved != nil {
			reserved.Close()
		}
		return UserNS{}, nil, nil
	}
	mnt, ns, err := d.slotFor(dir, base, reserved)
	if err != nil {
		return UserNS{}, nil, err
	}
	if ns != reserved {
		u.Add(func(context.Context) error { ns.Close(); return nil })
	}
	// An overlay root's top directory is the upper layer's, made by
	// storage and owned by host root; sandbox root must own it.
	if err := shiftRootDir(spec.RootFS); err != nil {
		return UserNS{}, nil, err
	}
	if err := bindRoot(spec.RootFS, mnt); err != nil {
		return UserNS{}, nil, err
	}
	userns := UserNS{HostID: base, Size: idRange, Path: ns.Path}
	spec.RootFS = mnt
	if spec.Network != nil {
		userns.Sysfs = filepath.Join(filepath.Dir(mnt), "sys")
		if err := prepareNetNS(spec.Network.NetNSPath, userns.Sysfs); err != nil {
			return UserNS{}, nil, err
		}
	}
	return userns, ns, nil
}

// slotFor returns the root's mount point in the sandbox directory dir's
// slot and the namespace to run in: with reserved, the reserved slot,
// whose range must start at base, the first host ID of the root; without,
// a new slot and namespace in the stored range, which the root must show.
func (d *Driver) slotFor(dir string, base uint32, reserved *userNS) (string, *userNS, error) {
	if reserved != nil {
		n, mnt, err := d.linkedSlot(dir)
		if err != nil {
			return "", nil, err
		}
		if base != rangeBase(n) {
			return "", nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "root shows host IDs from %d, the reserved range starts at %d", base, rangeBase(n))
		}
		return mnt, reserved, nil
	}
	if base != idBase {
		return "", nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "root shows host IDs from %d but no range is reserved for it", base)
	}
	n, mnt, err := d.allocSlot(dir)
	if err != nil {
		return "", nil, err
	}
	ns, err := newUserNS(d.holder, ownerID(n), sandboxMap(idBase))
	if err != nil {
		return "", nil, err
	}
	return mnt, ns, nil
}

// runBundle writes the OCI config of spec to dir and runs the container
// (run), from inside the sandbox's network namespace when runc cannot
// join it itself (netns.go).
func (d *Driver) runBundle(ctx context.Context, dir, sock string, spec driver.Spec, userns UserNS) (pid int, ready *os.File, err error) {
	oci := OCISpec(spec, d.host, userns)
	if err := KeepLockedFlags(oci, spec.Mounts); err != nil {
		return 0, nil, err
	}
	config, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return 0, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), config, 0o600); err != nil {
		return 0, nil, err
	}
	// runc itself is not interrupted when the caller gives up: killing it
	// midway orphans its `runc init` children. Only a hung runc is killed,
	// at StartTimeout.
	runCtx, cancelRun := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StartTimeout)
	defer cancelRun()
	runRunc := func() (err error) {
		pid, ready, err = d.run(runCtx, spec.ID, dir, sock, spec.Started)
		return err
	}
	if userns.Size > 0 && spec.Network != nil {
		err = ocirt.InNetNS(spec.Network.NetNSPath, runRunc)
	} else {
		err = runRunc()
	}
	return pid, ready, err
}

// run starts the container and returns its init's pid and the read end of
// the agent's ready pipe. The listening socket and the pipe's write end
// exist only in the container once run returns. started, when set, is
// called once the socket listens, before runc starts: a connection made
// from then on waits in the socket's backlog until the agent, which sets
// up everything it needs before it serves, takes it (or is reset when the
// container fails and the last copy of the socket is closed).
func (d *Driver) run(ctx context.Context, id, dir, sock string, started func()) (pid int, ready *os.File, err error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return 0, nil, fmt.Errorf("listening for the agent: %w", err)
	}
	// The socket file must outlive our copy of the listener: the agent
	// keeps listening on it after the daemon closes its descriptors.
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	l.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("listening for the agent: %w", err)
	}
	defer lf.Close()
	if started != nil {
		started()
	}

	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer w.Close()
	defer func() {
		if err != nil {
			r.Close()
		}
	}()

	pidPath := filepath.Join(dir, pidFile)
	// runc passes its stdio through to the container's init when it has no
	// terminal, so the agent's output and runc's own errors both land in
	// agent.log. --preserve-fds 2 hands fds 3 and 4 (ExtraFiles) to init.
	// --no-new-keyring: a session keyring per container is charged to the
	// host user that sandbox root maps to, the same for every sandbox, so
	// the kernel's per-user key limit (kernel.keys.maxkeys) would cap the
	// number of sandboxes. Sandboxes cannot use keyrings anyway (the
	// seccomp profile denies keyctl, add_key and request_key).
	cmd := d.cli.Command(ctx, "run", "--detach", "--no-new-keyring", "--preserve-fds", "2", "--pid-file", pidPath, "--bundle", dir, id)
	cmd.ExtraFiles = []*os.File{w, lf}
	if err := ocirt.RunLogged(ctx, cmd, filepath.Join(dir, logFile)); err != nil {
		return 0, nil, fmt.Errorf("running runc: %w", err)
	}
	if pid, err = ocirt.ReadPid(pidPath); err != nil {
		return 0, nil, fmt.Errorf("reading init pid: %w", err)
	}
	return pid, r, nil
}

// waitReady reads the agent's start-up line: "ok" or "error: <message>".
// End of file first means the agent died before it was ready.
func waitReady(ctx context.Context, r *os.File) error {
	if dl, ok := ctx.Deadline(); ok {
		r.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var line []byte
	buf := make([]byte, 256)
	for len(line) < 4096 {
		n, err := r.Read(buf)
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			msg := string(line[:i])
			if msg == "ok" {
				return nil
			}
			return fmt.Errorf("agent failed to start: %s", strings.TrimPrefix(msg, "error: "))
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for the agent: %w", ctx.Err())
			}
			return fmt.Errorf("waiting for the agent: %w", context.DeadlineExceeded)
		}
		if err == io.EOF {
			return fmt.Errorf("agent exited before it was ready")
		}
		if err != nil {
			return fmt.Errorf("waiting for the agent: %w", err)
		}
	}
	return fmt.Errorf("agent wrote an overlong ready line")
}
