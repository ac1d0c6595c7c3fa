// Package e2e drives a real `corral server` (runc, btrfs or overlay, SQLite)
// through the CLI and the Go SDK, the way a user does, and checks that
// nothing leaks on the host afterwards.
package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
	corral "github.com/corralrun/corral/sdk"
)

// daemon is a corral server started by a test, with the CLI and helpers
// of this suite.
type daemon struct {
	*daemontest.Daemon
	t testing.TB
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

// startDaemon starts a daemon (daemontest.New) with storage and the
// further server flags extra, builds the busybox template "bb", and at the
// end of t stops it and checks for leaks.
func startDaemon(t testing.TB, storage string, extra ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, daemontest.Options{Storage: storage, Args: extra})
}

// startDaemonWith is startDaemon with the daemon's options in full.
func startDaemonWith(t testing.TB, opts daemontest.Options) *daemon {
	t.Helper()
	requireHost(t)
	opts.Name = "e2e"
	d := &daemon{Daemon: daemontest.New(t, opts), t: t}
	d.BuildBusybox("bb")
	return d
}

// corral runs the CLI against the daemon and returns stdout, stderr and the
// exit code.
func (d *daemon) corral(args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.Bin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_HOST=unix://"+d.Socket)
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

// corralCmd is the CLI command for args against the daemon, to run with
// input or output of the test's choosing.
func (d *daemon) corralCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(d.Bin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_HOST=unix://"+d.Socket)
	return cmd
}

func (d *daemon) create(t testing.TB, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	if opts.Template == "" && opts.FromSnapshot == "" {
		opts.Template = "bb"
	}
	sb, err := d.Client.Create(t.Context(), opts)
	if err != nil {
		t.Fatalf("creating sandbox: %v\nlogs:\n%s", err, d.Logs())
	}
	return sb
}

func (d *daemon) execOut(t testing.TB, id string, shell string) (string, *corral.ExecResult) {
	t.Helper()
	var out bytes.Buffer
	res, err := d.Client.Exec(t.Context(), id, corral.ExecOptions{Shell: shell, Stdout: &out, Stderr: &out})
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

// logged waits up to 5 s for the daemon's log to hold s n times: the log
// arrives through a pipe, after the API response that it explains.
func (d *daemon) logged(s string, n int) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if strings.Count(d.Logs(), s) >= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
