// Package drivertest is the conformance suite that every driver.Driver
// implementation runs, including the fake. A driver's test calls Run with
// a Harness that makes drivers and root file systems; the suite creates
// sandboxes, checks the behaviour the Driver interface promises, and checks
// after each case that nothing leaked.
//
// Cases that need an ability a driver lacks by design (the fake enforces no
// limits) are skipped with a reason, never passed silently; the Harness
// declares those abilities in Features.
package drivertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// Features declare what a driver guarantees beyond the basic lifecycle,
// so that cases needing a missing guarantee are skipped visibly.
type Features struct {
	// Limits: memory and pids limits are enforced by the kernel, and
	// Stats reports usage and OOM kills.
	Limits bool
	// ProcessIsolation: a sandbox sees only its own processes.
	ProcessIsolation bool
	// Freeze: Pause stops the sandbox's processes, so an exec does not
	// complete until Resume.
	Freeze bool
	// OOMKillsInstance: going past the memory limit kills the whole
	// instance instead of the biggest process in it (gVisor has no
	// out-of-memory killer of its own, and the host's kills the Sentry).
	// The memory case then checks that the instance is reported stopped,
	// with the OOM kill in Stats, and that Delete cleans it up.
	OOMKillsInstance bool
	// PidsOvershoot is how many tasks Stats.Pids may show past the pids
	// limit: gVisor lets the processes the agent starts exceed it (while
	// every fork inside the sandbox fails at it), so the exec that runs
	// the fork loop and the agent's threads may be counted on top. The
	// agent is a Go program: on a loaded host its runtime holds more
	// threads (81, and later 97, tasks were counted against a limit of 64
	// under CI load).
	PidsOvershoot int64
	// Mounts: the driver binds Spec.Mounts into the sandbox, read-only
	// ones read-only.
	Mounts bool
}

// Harness adapts one driver to the suite.
type Harness struct {
	// New returns a driver for one test case. The suite deletes every
	// sandbox it creates; the harness closes the driver (t.Cleanup).
	New func(t *testing.T) driver.Driver
	// RootFS returns a fresh busybox root file system for one sandbox
	// (testutil.BusyboxRootfs for real drivers).
	RootFS func(t *testing.T) string
	// CopyRootFS returns a copy of the root file system at src, as
	// storage copies a sandbox's root for a fork (cp -a will do). The
	// checkpoint case needs it; nil skips that case.
	CopyRootFS func(t *testing.T, src string) string
	// CgroupParent is the cgroup parent the drivers from New use. After each
	// case the suite checks that no cgroup is left below it; empty skips
	// that check.
	CgroupParent string
	// Features the driver guarantees.
	Features Features

	// NewWithAgent returns a driver like New's whose sandboxes run the
	// program at agent as their agent, set up for start failure f (its
	// Timeout and BreakRuntime). Nil skips the FailedStart cases, for a
	// driver that runs no agent program.
	NewWithAgent func(t *testing.T, agent string, f StartFailure) driver.Driver
	// StartFailures are the ways the driver's start-up can fail, each a
	// FailedStart case; they depend on its start-up protocol and timing.
	StartFailures []StartFailure
	// ErrorPrefix starts every error of a failed Create, followed by the
	// sandbox ID and ": ".
	ErrorPrefix string
	// NothingLeft checks, after a failed Create of id with root file
	// system rootfs, what only the driver knows of (state and sandbox
	// directories, mounts, listeners, runtime processes); the suite
	// itself checks List, cgroups and processes. Nil checks nothing more.
	NothingLeft func(t *testing.T, d driver.Driver, id, rootfs string)
}

// Run runs every conformance case as a subtest of t, one after another.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"Lifecycle", testLifecycle},
		{"CreateDuplicate", testCreateDuplicate},
		{"FailedCreate", testFailedCreate},
		{"CreateRejects", testCreateRejects},
		{"MemoryLimit", testMemoryLimit},
		{"PidsLimit", testPidsLimit},
		{"Isolation", testIsolation},
		{"ConcurrentCreates", testConcurrentCreates},
		{"PauseResume", testPauseResume},
		{"ErrorKinds", testErrorKinds},
		{"CheckpointRestore", testCheckpointRestore},
		{"Mounts", testMounts},
		{"MountOverSymlink", testMountOverSymlink},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, newSuiteWith(t, h, h.New(t)))
		})
	}
	t.Run("FailedStart", func(t *testing.T) { testFailedStarts(t, h) })
}

// suite is the state of one case: its driver, the sandboxes and root file
// systems it made, for cleanup and leak checks.
type suite struct {
	h Harness
	d driver.Driver

	mu      sync.Mutex
	ids     []string
	rootfss []string
}

// newSuiteWith returns the state of a case run on d, a driver that the
// harness just made.
func newSuiteWith(t *testing.T, h Harness, d driver.Driver) *suite {
	s := &suite{h: h, d: d}
	// Registered after d was made, so it runs before the harness's own
	// cleanup closes the driver.
	t.Cleanup(func() { s.cleanup(t) })
	return s
}

// cleanup deletes whatever a failed case left and then checks for leaks:
// the driver lists nothing, no cgroup below the parent, no process rooted
// in one of the case's root file systems.
func (s *suite) cleanup(t *testing.T) {
	ctx := context.WithoutCancel(t.Context())
	for _, id := range s.ids {
		if err := s.d.Delete(ctx, id); err != nil {
			t.Errorf("cleanup: Delete(%s): %v", id, err)
		}
	}
	if ids, err := s.d.List(ctx); err != nil {
		t.Errorf("cleanup: List: %v", err)
	} else if len(ids) != 0 {
		t.Errorf("leak: driver still lists %v", ids)
	}
	if s.h.CgroupParent != "" {
		if dirs := testutil.CgroupDirs(t, s.h.CgroupParent); len(dirs) != 0 {
			t.Errorf("leak: cgroups left: %v", dirs)
		}
	}
	for _, r := range s.rootfss {
		if pids := testutil.ProcessesWithRoot(t, r); len(pids) != 0 {
			t.Errorf("leak: processes rooted in %s: %v", r, pids)
		}
	}
}

func (s *suite) rootfs(t *testing.T) string {
	r := s.h.RootFS(t)
	s.mu.Lock()
	s.rootfss = append(s.rootfss, r)
	s.mu.Unlock()
	return r
}

// newID returns a sandbox ID unique to this run, remembered for cleanup.
func (s *suite) newID(prefix string) string {
	id := fmt.Sprintf("%s-%08x", prefix, rand.Uint32())
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
	return id
}

// create makes a running sandbox with a fresh root file system.
func (s *suite) create(t *testing.T, prefix string, r driver.Resources) string {
	t.Helper()
	id := s.newID(prefix)
	spec := driver.Spec{ID: id, RootFS: s.rootfs(t), Hostname: prefix, Resources: r}
	if err := s.d.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	return id
}

// agent returns a client for sandbox id's agent, closed when the case ends.
func (s *suite) agent(t *testing.T, id string) *agentClient {
	a := newAgentClient(s.d, id)
	t.Cleanup(a.close)
	return a
}

// sh runs a shell command in sandbox id and fails the test if the exec
// itself fails (the command's exit code is the caller's business).
func (s *suite) sh(t *testing.T, id, script string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := s.agent(t, id).exec(ctx, wire.ExecRequest{Shell: script})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", script, id, err)
	}
	return res
}

// WaitStatus polls d until instance id has the status want and fails the
// test if it does not within limit.
func WaitStatus(t testing.TB, d driver.Driver, id string, want driver.Status, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st, err := d.Status(context.Background(), id)
		if err != nil {
			t.Fatalf("Status(%s): %v", id, err)
		}
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Status(%s) = %s after %v, want %s", id, st, limit, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *suite) wantStatus(t *testing.T, id string, want driver.Status) {
	t.Helper()
	got, err := s.d.Status(t.Context(), id)
	if err != nil || got != want {
		t.Fatalf("Status(%s) = %q, %v; want %q, nil", id, got, err, want)
	}
}
