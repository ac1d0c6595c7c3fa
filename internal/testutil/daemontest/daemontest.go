// Package daemontest runs a real `corral server` for the end-to-end
// suites (test/e2e, test/hostile, test/e2bcompat). Each daemon gets a
// fresh state dir, its own socket, cgroup parent and share of the host's
// network; when the test ends every sandbox is deleted, the daemon is
// stopped with SIGTERM and the host is checked for anything of it left.
//
// It is a package of its own rather than part of testutil because its leak
// checks know the runc and gVisor drivers, whose tests import testutil.
package daemontest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/daemon"
	"github.com/corralrun/corral/internal/driver/gvisor/gvisortest"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// startedLog is what the daemon logs once every listener serves.
const startedLog = "corral daemon started"

// Options configure a daemon started by New.
type Options struct {
	// Name tags the daemon's temporary directory and cgroup parent
	// ("corral-<Name>-..."), so that leftovers tell which suite left them.
	Name string
	// Storage is the --storage backend: "btrfs" or "overlay".
	Storage string
	// Args are further `corral server` flags, after the harness's own.
	Args []string
	// Env is added to the daemon's environment.
	Env []string
}

// Daemon is a `corral server` process of a test. Its methods must be
// called from the test's goroutine; Logs and Client may be used from any.
type Daemon struct {
	// Bin is the corral binary: the daemon, and the CLI to run against it.
	Bin string
	// Base is the daemon's temporary directory, holding StateDir and
	// Socket. Tests may put files of their own there; it is removed at
	// cleanup.
	Base string
	// StateDir is the daemon's --state-dir and Socket its --socket.
	// RunDir is its run dir, the default for StateDir (Args must not name
	// another): the daemon removes it when it stops without sandboxes.
	StateDir string
	RunDir   string
	Socket   string
	// Cgroup is the daemon's --cgroup-parent, such as "/corral-e2e-1a2b3c4d".
	Cgroup string
	// Storage is its --storage backend.
	Storage string
	// Net is its share of the host's network (subnet, interface prefix,
	// nftables table), passed as flags.
	Net testutil.DaemonNetwork
	// Client talks to the daemon over Socket, across restarts.
	Client *corral.Client

	t    testing.TB
	args []string
	env  []string
	cmd  *exec.Cmd
	logs testutil.SyncBuffer
	// exited is closed once the current process has exited, with
	// exitErr its Wait error.
	exited  chan struct{}
	exitErr error
}

// New starts a daemon and waits until it serves. It needs root (skipping
// or, under CORRAL_TEST_REQUIRE=1, failing otherwise) and builds the corral
// binary once per test process. At the end of t the daemon's sandboxes
// are deleted, it is stopped, and a leak of its mounts, cgroups, loop
// devices, sandbox processes, user-ID slots, runc or gVisor containers or
// network objects fails t; a failed t logs the daemon's output.
//
// CORRAL_E2E_LOGS, when set, names a file the daemon's output is appended
// to at cleanup, to read the timings it logs after a benchmark.
func New(t testing.TB, opts Options) *Daemon {
	t.Helper()
	testutil.RequiresRoot(t)
	bin := testutil.CorralBinary(t)
	network := testutil.NewDaemonNetwork(t)
	// Short paths: unix socket addresses are limited to 107 bytes.
	base, err := os.MkdirTemp("", "corral-"+opts.Name+"-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		Bin:      bin,
		Base:     base,
		StateDir: filepath.Join(base, "state"),
		RunDir:   daemon.DefaultRunDir(filepath.Join(base, "state")),
		Socket:   filepath.Join(base, "corral.sock"),
		Cgroup:   "/corral-" + opts.Name + "-" + randHex(4),
		Storage:  opts.Storage,
		Net:      network,
		t:        t,
		env:      opts.Env,
	}
	d.args = append([]string{"server", "--state-dir", d.StateDir, "--socket", d.Socket,
		"--storage", opts.Storage, "--cgroup-parent", d.Cgroup, "--log-level", "debug"}, network.Args(opts.Args)...)
	d.args = append(d.args, opts.Args...)
	t.Cleanup(d.cleanup)
	if d.Client, err = corral.New("unix://"+d.Socket, ""); err != nil {
		t.Fatal(err)
	}
	d.Start()
	return d
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start starts the daemon again after Stop or Kill, with the same flags
// and state dir, and waits up to 30 s until its API answers and it has
// logged that every listener (--listen, --e2b-listen) serves.
func (d *Daemon) Start() {
	d.t.Helper()
	started := strings.Count(d.logs.String(), startedLog)
	d.cmd = exec.Command(d.Bin, d.args...)
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = &d.logs, &d.logs
	if err := d.cmd.Start(); err != nil {
		d.t.Fatalf("starting daemon: %v", err)
	}
	cmd, exited := d.cmd, make(chan struct{})
	d.exited = exited
	go func() {
		d.exitErr = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			d.t.Fatalf("daemon exited while starting: %v\nlogs:\n%s", d.exitErr, d.logs.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.Client.Version(ctx)
		cancel()
		if err == nil && strings.Count(d.logs.String(), startedLog) == started {
			err = errors.New("the API answers, but not every listener serves yet")
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon did not come up: %v\nlogs:\n%s", err, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the daemon, as a crash would, and reaps it.
func (d *Daemon) Kill() {
	d.t.Helper()
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.Client.Close()
}

// Stop stops the daemon with SIGTERM and waits up to 30 s for it to exit;
// a daemon that exits with an error or must be killed fails the test.
// Stopping a daemon that is not running does nothing.
func (d *Daemon) Stop() {
	d.t.Helper()
	if !d.Running() {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.exitErr != nil {
			d.t.Errorf("daemon exited with %v\nlogs:\n%s", d.exitErr, d.logs.String())
		}
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("daemon did not stop on SIGTERM\nlogs:\n%s", d.logs.String())
	}
	d.Client.Close()
}

// Cmd is the daemon's current process; Start replaces it.
func (d *Daemon) Cmd() *exec.Cmd { return d.cmd }

// Logs returns everything the daemon wrote to stdout and stderr so far,
// over all its starts. The log arrives through a pipe, possibly after the
// API response it explains.
func (d *Daemon) Logs() string { return d.logs.String() }

// Running reports whether the daemon's current process has not exited.
func (d *Daemon) Running() bool {
	if d.exited == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// BuildBusybox builds the busybox template name, failing the test if it
// cannot.
func (d *Daemon) BuildBusybox(name string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.Client.BuildTemplate(ctx, name, corral.BuildOptions{Recipe: "busybox"}, nil); err != nil {
		d.t.Fatalf("building busybox template: %v", err)
	}
}

// Slots returns the directories of the user-ID slots (runc's idmapped
// sandbox roots) that this daemon's sandboxes hold: each slot's owner link
// names a directory under RunDir (or StateDir).
func (d *Daemon) Slots() []string {
	entries, _ := os.ReadDir(runc.DefaultMountDir)
	var out []string
	for _, e := range entries {
		owner, err := os.Readlink(filepath.Join(runc.DefaultMountDir, e.Name(), "owner"))
		if err == nil && (strings.HasPrefix(owner, d.StateDir+"/") || strings.HasPrefix(owner, d.RunDir+"/")) {
			out = append(out, filepath.Join(runc.DefaultMountDir, e.Name()))
		}
	}
	return out
}

// cleanup deletes every sandbox, stops the daemon, checks that nothing of
// it is left on the host and removes its directory.
func (d *Daemon) cleanup() {
	t := d.t
	if d.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		list, err := d.Client.List(ctx, corral.ListOptions{})
		if err != nil {
			t.Errorf("listing sandboxes at cleanup: %v", err)
		}
		for _, sb := range list {
			// A sandbox whose own timer destroys it between the list and
			// the delete is gone, as the delete wanted.
			if err := d.Client.Delete(ctx, sb.ID); err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
				t.Errorf("deleting %s at cleanup: %v", sb.ID, err)
			}
		}
		cancel()
		d.Stop()
	}
	d.checkNoLeaks()
	if t.Failed() {
		t.Logf("daemon logs:\n%s", d.logs.String())
	}
	if f := os.Getenv("CORRAL_E2E_LOGS"); f != "" {
		if err := appendFile(f, d.logs.String()); err != nil {
			t.Errorf("writing the daemon log: %v", err)
		}
	}
	os.RemoveAll(d.Base)
	if d.RunDir != "" && len(testutil.Mounts(t, d.RunDir)) == 0 {
		os.RemoveAll(d.RunDir)
	}
}

// checkNoLeaks fails the test for every mount, cgroup, loop device,
// process, user-ID slot, runc container, gVisor sandbox or network object
// of the daemon still on the host, then removes the daemon's (now empty)
// cgroup parents.
func (d *Daemon) checkNoLeaks() {
	t := d.t
	t.Helper()
	// A daemon that stops without sandboxes removes its run dir. (First:
	// `runc list` below creates the directory it is given.)
	if !d.Running() && d.RunDir != "" {
		if left := testutil.Files(t, d.RunDir); len(left) > 0 {
			t.Errorf("left in the run dir after the daemon stopped: %v", left)
		}
	}
	for _, dir := range []string{d.StateDir, d.RunDir} {
		if m := testutil.Mounts(t, dir); dir != "" && len(m) > 0 {
			t.Errorf("leaked mounts: %v", m)
		}
	}
	if c := testutil.CgroupDirs(t, d.Cgroup); len(c) > 0 {
		t.Errorf("leaked cgroups: %v", c)
	}
	if l := testutil.LoopDevicesBackedBy(t, d.StateDir); len(l) > 0 {
		t.Errorf("leaked loop devices: %v", l)
	}
	if p := testutil.ProcessesWithRoot(t, d.StateDir); len(p) > 0 {
		t.Errorf("leaked sandbox processes: %v", p)
	}
	for _, slot := range d.Slots() {
		t.Errorf("leaked user ID slot %s", slot)
		if m := testutil.Mounts(t, slot); len(m) > 0 {
			t.Errorf("leaked idmapped mounts: %v", m)
		}
		if p := testutil.ProcessesWithRoot(t, slot); len(p) > 0 {
			t.Errorf("leaked sandbox processes: %v", p)
		}
	}
	out, err := exec.Command("runc", "--root", filepath.Join(d.RunDir, "runc", "state"), "list", "-q").Output()
	if err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("leaked runc containers: %s", out)
	}
	if g := gvisortest.Leftovers(filepath.Join(d.RunDir, "gvisor")); len(g) > 0 {
		t.Errorf("leaked gVisor sandboxes: %v", g)
	}
	if n := d.Net.Leftovers(t); len(n) > 0 {
		t.Errorf("leaked network objects: %v", n)
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range append(roots, "/sys/fs/cgroup") {
		_ = os.Remove(filepath.Join(r, d.Cgroup))
	}
}

// appendFile appends text to the file name, creating it.
func appendFile(name, text string) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}
