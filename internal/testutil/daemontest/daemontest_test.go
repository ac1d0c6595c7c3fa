package daemontest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// recorder is a testing.TB whose failures and logs are recorded instead
// of failing the test that runs it.
type recorder struct {
	testing.TB
	errors []string
	logs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) Failed() bool { return len(r.errors) > 0 }

// Fatalf records like Errorf and ends the calling goroutine, as FailNow
// does: callers run the code under test in a goroutine of its own.
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// TestStartNoticesExit: a daemon that exits while starting (here on a
// flag it does not know) fails its test with its log at once, instead of
// being polled until the start-up deadline.
func TestStartNoticesExit(t *testing.T) {
	rec := &recorder{TB: t}
	d := &Daemon{Bin: testutil.CorralBinary(t), args: []string{"server", "--no-such-flag"}, t: rec}
	var err error
	if d.Client, err = corral.New("unix://"+filepath.Join(t.TempDir(), "none.sock"), ""); err != nil {
		t.Fatal(err)
	}
	defer d.Client.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Start()
	}()
	<-done
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "daemon exited while starting: exit status 2") ||
		!strings.Contains(rec.errors[0], "no-such-flag") {
		t.Errorf("errors: %q; want one saying the daemon exited, with its log", rec.errors)
	}
	if d.Running() {
		t.Error("Running after the process exited")
	}
}

// TestCleanup checks that the cleanup of a daemon that is no longer
// running fails its test for a mount left under the state dir or a file
// left in the run dir, prints the daemon's log only then, and writes it to
// CORRAL_E2E_LOGS either way.
func TestCleanup(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, tt := range []struct {
		name       string
		leakMount  bool
		leakFile   bool
		wantErrors []string
	}{
		{name: "clean"},
		{name: "leaked mount", leakMount: true, wantErrors: []string{"leaked mounts: [STATE/leak]"}},
		{name: "file left in the run dir", leakFile: true, wantErrors: []string{"left in the run dir after the daemon stopped: [RUN RUN/runc RUN/runc/config.json]"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			rec := &recorder{TB: t}
			d := &Daemon{Base: base, StateDir: filepath.Join(base, "state"), RunDir: filepath.Join(t.TempDir(), "run"),
				Cgroup: "/corral-daemontest-" + randHex(4), Net: testutil.NewDaemonNetwork(t), t: rec}
			if tt.leakFile {
				if err := os.MkdirAll(filepath.Join(d.RunDir, "runc"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d.RunDir, "runc", "config.json"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tt.leakMount {
				leak := filepath.Join(d.StateDir, "leak")
				if err := os.MkdirAll(leak, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mount("tmpfs", leak, "tmpfs", 0, ""); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = unix.Unmount(leak, unix.MNT_DETACH) })
			}
			_, _ = d.logs.Write([]byte("the daemon's log\n"))
			logFile := filepath.Join(t.TempDir(), "daemon.log")
			t.Setenv("CORRAL_E2E_LOGS", logFile)

			d.cleanup()

			var got []string
			for _, e := range rec.errors {
				got = append(got, strings.ReplaceAll(strings.ReplaceAll(e, d.StateDir, "STATE"), d.RunDir, "RUN"))
			}
			if strings.Join(got, "\n") != strings.Join(tt.wantErrors, "\n") {
				t.Errorf("errors: got %q, want %q", got, tt.wantErrors)
			}
			printed := strings.Contains(strings.Join(rec.logs, "\n"), "daemon logs:\nthe daemon's log\n")
			if printed != (tt.leakMount || tt.leakFile) {
				t.Errorf("daemon log printed: %v, want %v (logs %q)", printed, !printed, rec.logs)
			}
			if b, err := os.ReadFile(logFile); err != nil || string(b) != "the daemon's log\n" {
				t.Errorf("CORRAL_E2E_LOGS file: %q, %v", b, err)
			}
		})
	}
}
