// Package e2e drives a real `corral server` (runc, btrfs or overlay, SQLite)
// through the CLI and the Go SDK, the way a user does, and checks that
// nothing leaks on the host afterwards.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver/gvisor/gvisortest"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// daemon is a corral server started by a test.
type daemon struct {
	t        testing.TB
	bin      string
	stateDir string
	socket   string
	cgroup   string
	storage  string
	net      testutil.DaemonNetwork
	args     []string
	cmd      *exec.Cmd
	logs     *syncBuffer
	client   *corral.Client
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func requireHost(t testing.TB) string {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "busybox")
	testutil.RequiresBinary(t, "mkfs.btrfs")
	return testutil.CorralBinary(t)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startDaemon starts a daemon on a fresh state dir with its own socket and
// cgroup parent, builds the busybox template "bb", and registers a cleanup
// that stops it and checks for leaks.
func startDaemon(t testing.TB, storage string, extra ...string) *daemon {
	t.Helper()
	bin := requireHost(t)
	// Short paths: unix socket addresses are limited to 107 bytes.
	base, err := os.MkdirTemp("", "corral-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{
		t:        t,
		bin:      bin,
		stateDir: filepath.Join(base, "state"),
		socket:   filepath.Join(base, "corral.sock"),
		cgroup:   "/corral-e2e-" + randHex(4),
		storage:  storage,
		logs:     &syncBuffer{},
	}
	d.net = testutil.NewDaemonNetwork(t)
	d.args = append([]string{"server", "--state-dir", d.stateDir, "--socket", d.socket,
		"--storage", storage, "--cgroup-parent", d.cgroup, "--log-level", "debug"}, d.net.Args(extra)...)
	d.args = append(d.args, extra...)
	t.Cleanup(func() {
		d.cleanup()
		os.RemoveAll(base)
	})
	d.start()
	d.buildBusybox("bb")
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout = d.logs
	d.cmd.Stderr = d.logs
	if err := d.cmd.Start(); err != nil {
		d.t.Fatalf("starting daemon: %v", err)
	}
	c, err := corral.New("unix://"+d.socket, "")
	if err != nil {
		d.t.Fatal(err)
	}
	d.client = c
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Version(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon did not come up: %v\nlogs:\n%s", err, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the daemon, as a crash would.
func (d *daemon) kill() {
	d.t.Helper()
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	d.client.Close()
}

// stop stops the daemon with SIGTERM and waits for it.
func (d *daemon) stop() {
	d.t.Helper()
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			d.t.Errorf("daemon exited with %v\nlogs:\n%s", err, d.logs.String())
		}
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
		d.t.Errorf("daemon did not stop on SIGTERM\nlogs:\n%s", d.logs.String())
	}
	d.client.Close()
}

// cleanup deletes every sandbox and template, stops the daemon and checks
// that nothing of it is left on the host.
func (d *daemon) cleanup() {
	t := d.t
	if d.cmd != nil && d.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		list, err := d.client.List(ctx, corral.ListOptions{})
		if err != nil {
			t.Errorf("listing sandboxes at cleanup: %v", err)
		}
		for _, sb := range list {
			if err := d.client.Delete(ctx, sb.ID); err != nil {
				t.Errorf("deleting %s at cleanup: %v", sb.ID, err)
			}
		}
		cancel()
		d.stop()
	}
	checkNoLeaks(t, d)
	if t.Failed() {
		t.Logf("daemon logs:\n%s", d.logs.String())
	}
	// CORRAL_E2E_LOGS names a file for the daemon's log, to read the
	// timings it logs after a benchmark.
	if f := os.Getenv("CORRAL_E2E_LOGS"); f != "" {
		if err := os.WriteFile(f, []byte(d.logs.String()), 0o644); err != nil {
			t.Errorf("writing the daemon log: %v", err)
		}
	}
}

// checkNoLeaks asserts that no mount, cgroup, loop device, process or runc
// container of the daemon's state dir is left.
func checkNoLeaks(t testing.TB, d *daemon) {
	t.Helper()
	if m := testutil.Mounts(t, d.stateDir); len(m) > 0 {
		t.Errorf("leaked mounts: %v", m)
	}
	if c := testutil.CgroupDirs(t, d.cgroup); len(c) > 0 {
		t.Errorf("leaked cgroups: %v", c)
	}
	if l := testutil.LoopDevicesBackedBy(t, d.stateDir); len(l) > 0 {
		t.Errorf("leaked loop devices: %v", l)
	}
	if p := testutil.ProcessesWithRoot(t, d.stateDir); len(p) > 0 {
		t.Errorf("leaked sandbox processes: %v", p)
	}
	out, err := exec.Command("runc", "--root", filepath.Join(d.stateDir, "runc", "state"), "list", "-q").Output()
	if err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("leaked runc containers: %s", out)
	}
	if g := gvisortest.Leftovers(filepath.Join(d.stateDir, "gvisor")); len(g) > 0 {
		t.Errorf("leaked gVisor sandboxes: %v", g)
	}
	if n := d.net.Leftovers(t); len(n) > 0 {
		t.Errorf("leaked network objects: %v", n)
	}
	// Remove the now empty cgroup parents.
	for _, c := range cgroupParents(d.cgroup) {
		_ = os.Remove(c)
	}
}

func cgroupParents(parent string) []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range roots {
		out = append(out, filepath.Join(r, parent))
	}
	return out
}

func (d *daemon) buildBusybox(name string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.client.BuildTemplate(ctx, name, corral.BuildOptions{Recipe: "busybox"}, nil); err != nil {
		d.t.Fatalf("building busybox template: %v", err)
	}
}

// corral runs the CLI against the daemon and returns stdout, stderr and the
// exit code.
func (d *daemon) corral(args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_HOST=unix://"+d.socket)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			d.t.Fatalf("running corral %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

func (d *daemon) create(t testing.TB, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	if opts.Template == "" && opts.FromSnapshot == "" {
		opts.Template = "bb"
	}
	sb, err := d.client.Create(t.Context(), opts)
	if err != nil {
		t.Fatalf("creating sandbox: %v\nlogs:\n%s", err, d.logs.String())
	}
	return sb
}

func (d *daemon) execOut(t testing.TB, id string, shell string) (string, *corral.ExecResult) {
	t.Helper()
	var out bytes.Buffer
	res, err := d.client.Exec(t.Context(), id, corral.ExecOptions{Shell: shell, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", shell, id, err)
	}
	return out.String(), res
}

func storages() []string { return []string{"btrfs", "overlay"} }

func forEachStorage(t *testing.T, f func(t *testing.T, storage string)) {
	for _, s := range storages() {
		t.Run(s, func(t *testing.T) { f(t, s) })
	}
}

// freeAddr returns a loopback address with a port free at the time of the
// call, for a daemon's TCP listener.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// logged waits up to 5 s for the daemon's log to hold s n times: the log
// arrives through a pipe, after the API response that it explains.
func (d *daemon) logged(s string, n int) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if strings.Count(d.logs.String(), s) >= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
