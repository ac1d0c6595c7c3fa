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
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
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
		{"MemoryLimit", testMemoryLimit},
		{"PidsLimit", testPidsLimit},
		{"Isolation", testIsolation},
		{"ConcurrentCreates", testConcurrentCreates},
		{"PauseResume", testPauseResume},
		{"ErrorKinds", testErrorKinds},
		{"CheckpointRestore", testCheckpointRestore},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, newSuite(t, h))
		})
	}
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

func newSuite(t *testing.T, h Harness) *suite {
	s := &suite{h: h, d: h.New(t)}
	// Registered after New, so it runs before the harness's own cleanup
	// closes the driver.
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

func testLifecycle(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.create(t, "life", driver.Resources{MemoryBytes: 128 << 20, MilliCPUs: 1000, Pids: 256})
	s.wantStatus(t, id, driver.StatusRunning)

	h, err := s.agent(t, id).health(ctx)
	if err != nil || !h.OK {
		t.Fatalf("agent health = %+v, %v; want ok", h, err)
	}
	res := s.sh(t, id, "echo hi")
	if res.stdout != "hi\n" || res.exitCode != 0 {
		t.Fatalf("echo hi gave stdout %q exit %d, stderr %q", res.stdout, res.exitCode, res.stderr)
	}
	if res := s.sh(t, id, "exit 7"); res.exitCode != 7 {
		t.Errorf("exit 7 reported exit code %d", res.exitCode)
	}
	st, err := s.d.Stats(ctx, id)
	if err != nil {
		t.Fatalf("Stats(%s): %v", id, err)
	}
	if s.h.Features.Limits && (st.MemoryBytes <= 0 || st.CPUUsageNanos <= 0 || st.Pids < 1) {
		t.Errorf("Stats(%s) = %+v; want memory, CPU and pids above zero", id, st)
	}
	ids, err := s.d.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Errorf("List() = %v, %v; want it to contain %s", ids, err, id)
	}

	if err := s.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusUnknown)
	if err := s.d.Delete(ctx, id); err != nil {
		t.Errorf("second Delete(%s) = %v, want nil", id, err)
	}
	if ids, err := s.d.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Errorf("List() after delete = %v, %v; want no %s", ids, err, id)
	}
	if c, err := s.d.DialAgent(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		if c != nil {
			c.Close()
		}
		t.Errorf("DialAgent after delete = %v, want ErrNotFound", err)
	}
	if _, err := s.d.Stats(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stats after delete = %v, want ErrNotFound", err)
	}
	if err := s.d.Delete(ctx, "never-created"); err != nil {
		t.Errorf("Delete of an unknown id = %v, want nil", err)
	}
}

func testCreateDuplicate(t *testing.T, s *suite) {
	id := s.create(t, "dup", driver.Resources{})
	err := s.d.Create(t.Context(), driver.Spec{ID: id, RootFS: s.rootfs(t)})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Create(%s) = %v, want ErrAlreadyExists", id, err)
	}
	// The failed duplicate must not have harmed the original.
	s.wantStatus(t, id, driver.StatusRunning)
	if res := s.sh(t, id, "echo still"); res.stdout != "still\n" {
		t.Errorf("original sandbox after duplicate create: stdout %q", res.stdout)
	}
}

func testFailedCreate(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.newID("fail")
	missing := s.rootfs(t) + "/does-not-exist"
	if err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: missing}); err == nil {
		t.Fatalf("Create with a missing root file system succeeded")
	}
	if ids, err := s.d.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List() after failed create = %v, %v; want empty", ids, err)
	}
	if s.h.CgroupParent != "" {
		if dirs := testutil.CgroupDirs(t, s.h.CgroupParent); len(dirs) != 0 {
			t.Fatalf("cgroups left by failed create: %v", dirs)
		}
	}
	s.wantStatus(t, id, driver.StatusUnknown)
	// Nothing of the failed attempt blocks the ID.
	if err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: s.rootfs(t)}); err != nil {
		t.Fatalf("Create(%s) after a failed create: %v", id, err)
	}
}

func testMemoryLimit(t *testing.T, s *suite) {
	if !s.h.Features.Limits {
		t.Skip("driver does not declare Features.Limits")
	}
	id := s.create(t, "mem", driver.Resources{MemoryBytes: 32 << 20})
	// dd allocates its whole block before it reads: 200 MB > 32 MiB.
	const dd = "dd if=/dev/zero of=/dev/null bs=200M count=1"
	if s.h.Features.OOMKillsInstance {
		testInstanceOOM(t, s, id, dd)
		return
	}
	res := s.sh(t, id, dd)
	if res.exitCode == 0 {
		t.Fatalf("allocating 200 MB under a 32 MiB limit succeeded: %+v", res)
	}
	st, err := s.d.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dd under a 32 MiB limit: exit %d signal %q oom %v; stats %+v", res.exitCode, res.signal, res.oomKilled, st)
	if st.OOMKills < 1 {
		t.Errorf("Stats.OOMKills = %d after an OOM kill, want >= 1 (exec result %+v)", st.OOMKills, res)
	}
	// The agent survives: the kernel kills the biggest process.
	if res := s.sh(t, id, "echo alive"); res.stdout != "alive\n" {
		t.Errorf("sandbox after OOM: stdout %q", res.stdout)
	}
}

// testInstanceOOM runs script, which allocates past sandbox id's memory
// limit, in a driver whose instances die of that as a whole.
func testInstanceOOM(t *testing.T, s *suite, id, script string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := s.agent(t, id).exec(ctx, wire.ExecRequest{Shell: script})
	if err == nil && res.exitCode == 0 {
		t.Fatalf("allocating 200 MB under a 32 MiB limit succeeded: %+v", res)
	}
	t.Logf("allocation under a 32 MiB limit: %+v, %v", res, err)
	WaitStatus(t, s.d, id, driver.StatusStopped, 10*time.Second)
	st, err := s.d.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("Stats.OOMKills = %d after an OOM kill, want >= 1", st.OOMKills)
	}
	if c, ok := s.d.(driver.OOMCounter); ok {
		if n, err := c.OOMKills(t.Context(), id); err != nil || n != st.OOMKills {
			t.Errorf("OOMKills = %d, %v; want Stats.OOMKills %d", n, err, st.OOMKills)
		}
	}
	if err := s.d.Delete(t.Context(), id); err != nil {
		t.Fatalf("Delete of an instance killed by OOM: %v", err)
	}
	s.wantStatus(t, id, driver.StatusUnknown)
}

func testPidsLimit(t *testing.T, s *suite) {
	if !s.h.Features.Limits {
		t.Skip("driver does not declare Features.Limits")
	}
	const limit = 64
	id := s.create(t, "pids", driver.Resources{Pids: limit})
	res := s.sh(t, id, `i=0; while [ $i -lt 200 ]; do sleep 60 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned all`)
	if strings.Contains(res.stdout, "spawned all") {
		t.Fatalf("started 200 processes under a pids limit of %d", limit)
	}
	st, err := s.d.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork loop under a pids limit of %d: exit %d stderr %q; stats %+v", limit, res.exitCode, res.stderr, st)
	if st.Pids > limit+s.h.Features.PidsOvershoot || st.Pids < limit/2 {
		t.Errorf("Stats.Pids = %d, want close to the limit %d", st.Pids, limit)
	}
}

func testIsolation(t *testing.T, s *suite) {
	ctx := t.Context()
	a := s.create(t, "iso-a", driver.Resources{})
	b := s.create(t, "iso-b", driver.Resources{})
	if err := s.agent(t, a).writeFile(ctx, "/tmp/marker", []byte("secret")); err != nil {
		t.Fatalf("writing a file in %s: %v", a, err)
	}
	if got, err := s.agent(t, a).readFile(ctx, "/tmp/marker"); err != nil || string(got) != "secret" {
		t.Fatalf("reading the file back in %s = %q, %v", a, got, err)
	}
	if _, err := s.agent(t, b).readFile(ctx, "/tmp/marker"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("reading %s's file in %s = %v, want ErrNotFound", a, b, err)
	}
	if !s.h.Features.ProcessIsolation {
		t.Skip("driver does not declare Features.ProcessIsolation")
	}
	s.sh(t, a, "sleep 4242 >/dev/null 2>&1 &")
	if res := s.sh(t, a, "ps"); !strings.Contains(res.stdout, "sleep 4242") {
		t.Fatalf("ps in %s does not show its own process:\n%s", a, res.stdout)
	}
	if res := s.sh(t, b, "ps"); strings.Contains(res.stdout, "sleep 4242") {
		t.Errorf("ps in %s shows %s's process:\n%s", b, a, res.stdout)
	}
	if res := s.sh(t, b, "hostname"); res.stdout != "iso-b\n" {
		t.Errorf("hostname in %s = %q, want iso-b", b, res.stdout)
	}
}

func testConcurrentCreates(t *testing.T, s *suite) {
	const n = 5
	ids := make([]string, n)
	specs := make([]driver.Spec, n)
	for i := range ids {
		ids[i] = s.newID(fmt.Sprintf("conc%d", i))
		specs[i] = driver.Spec{ID: ids[i], RootFS: s.rootfs(t), Resources: driver.Resources{MemoryBytes: 64 << 20}}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { errs[i] = s.d.Create(t.Context(), specs[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Create(%s): %v", ids[i], err)
		}
	}
	if t.Failed() {
		return
	}
	for _, id := range ids {
		if res := s.sh(t, id, "hostname"); res.exitCode != 0 {
			t.Errorf("exec in %s: %+v", id, res)
		}
	}
	for i := range ids {
		wg.Go(func() { errs[i] = s.d.Delete(t.Context(), ids[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Delete(%s): %v", ids[i], err)
		}
	}
}

func testPauseResume(t *testing.T, s *suite) {
	p, ok := s.d.(driver.Pauser)
	if !ok {
		if s.d.Capabilities().Pause {
			t.Fatal("Capabilities().Pause is true but the driver is not a driver.Pauser")
		}
		t.Skip("driver does not implement driver.Pauser")
	}
	if !s.d.Capabilities().Pause {
		t.Error("driver implements driver.Pauser but Capabilities().Pause is false")
	}
	ctx := t.Context()
	id := s.create(t, "pause", driver.Resources{})
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusPaused)
	if s.h.Features.Freeze {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.agent(t, id).exec(short, wire.ExecRequest{Shell: "echo frozen"})
		cancel()
		if err == nil {
			t.Errorf("exec in a paused sandbox completed")
		}
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume(%s): %v", id, err)
	}
	s.wantStatus(t, id, driver.StatusRunning)
	if res := s.sh(t, id, "echo thawed"); res.stdout != "thawed\n" {
		t.Errorf("exec after resume: stdout %q", res.stdout)
	}
	// Deleting a paused sandbox works too.
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("second Pause(%s): %v", id, err)
	}
	if err := s.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a paused sandbox: %v", err)
	}
	s.wantStatus(t, id, driver.StatusUnknown)
}

// testErrorKinds checks the errdefs kinds of the optional abilities:
// ErrNotFound for an unknown instance, ErrFailedPrecondition for a state
// that does not allow the call.
func testErrorKinds(t *testing.T, s *suite) {
	ctx := t.Context()
	id := s.create(t, "kinds", driver.Resources{})
	if p, ok := s.d.(driver.Pauser); ok {
		if err := p.Pause(ctx, "never-created"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Pause(unknown) = %v, want ErrNotFound", err)
		}
		if err := p.Resume(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Resume(running) = %v, want ErrFailedPrecondition", err)
		}
	}
	if u, ok := s.d.(driver.Updater); ok {
		if err := u.Update(ctx, "never-created", driver.Resources{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Update(unknown) = %v, want ErrNotFound", err)
		}
	}
	if c, ok := s.d.(driver.Checkpointer); ok {
		if err := c.Checkpoint(ctx, "never-created", t.TempDir(), true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Checkpoint(unknown) = %v, want ErrNotFound", err)
		}
	}
}

// counterLoop is a background process whose state is in memory: its
// counter i, mirrored into /tmp/c ten times a second. The file is replaced
// at once each time: "echo > /tmp/c" truncates it first, and a read could
// fall in between.
const counterLoop = "i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done"

func testCheckpointRestore(t *testing.T, s *suite) {
	cp, ok := s.d.(driver.Checkpointer)
	if !ok {
		if s.d.Capabilities().Checkpoint {
			t.Fatal("Capabilities().Checkpoint is true but the driver is not a driver.Checkpointer")
		}
		t.Skip("driver does not implement driver.Checkpointer")
	}
	if !s.d.Capabilities().Checkpoint {
		t.Error("driver implements driver.Checkpointer but Capabilities().Checkpoint is false")
	}
	if s.h.CopyRootFS == nil {
		t.Skip("harness cannot copy root file systems (Harness.CopyRootFS)")
	}
	ctx := t.Context()
	orig := s.newID("ckpt")
	root := s.rootfs(t)
	r := driver.Resources{MemoryBytes: 256 << 20, Pids: 128}
	if err := s.d.Create(ctx, driver.Spec{ID: orig, RootFS: root, Hostname: "ckpt", Resources: r}); err != nil {
		t.Fatalf("Create(%s): %v", orig, err)
	}
	a := s.agent(t, orig)
	if err := a.writeFile(ctx, "/root/before", []byte("written before")); err != nil {
		t.Fatal(err)
	}
	proc, err := a.c.StartProcess(ctx, wire.StartRequest{ExecRequest: wire.ExecRequest{Shell: counterLoop}})
	if err != nil {
		t.Fatalf("starting the counter: %v", err)
	}
	counter := func(id string) int {
		t.Helper()
		b, err := s.agent(t, id).readFile(ctx, "/tmp/c")
		if err != nil {
			t.Fatalf("reading the counter in %s: %v", id, err)
		}
		var n int
		if _, err := fmt.Sscan(string(b), &n); err != nil {
			t.Fatalf("counter in %s is %q", id, b)
		}
		return n
	}
	time.Sleep(time.Second)
	atCheckpoint := counter(orig)

	image := t.TempDir()
	t0 := time.Now()
	if err := cp.Checkpoint(ctx, orig, image, true); err != nil {
		t.Fatalf("Checkpoint(%s): %v", orig, err)
	}
	checkpointed := time.Since(t0)
	s.wantStatus(t, orig, driver.StatusRunning)
	// Two copies, each from its own copy of the root.
	copies := []string{s.newID("copy1"), s.newID("copy2")}
	var restores []time.Duration
	for _, id := range copies {
		croot := s.h.CopyRootFS(t, root)
		s.mu.Lock()
		s.rootfss = append(s.rootfss, croot)
		s.mu.Unlock()
		t1 := time.Now()
		if err := cp.Restore(ctx, id, driver.Spec{RootFS: croot, Hostname: id, Resources: r}, image); err != nil {
			t.Fatalf("Restore(%s): %v", id, err)
		}
		restores = append(restores, time.Since(t1))
		s.wantStatus(t, id, driver.StatusRunning)
	}
	t.Logf("checkpoint (leave running) %v, restores %v", checkpointed, restores)
	for _, id := range append([]string{orig}, copies...) {
		if n := counter(id); n < atCheckpoint {
			t.Errorf("counter in %s = %d, want it to continue from %d", id, n, atCheckpoint)
		}
		if b, err := s.agent(t, id).readFile(ctx, "/root/before"); err != nil || string(b) != "written before" {
			t.Errorf("file written before the checkpoint in %s: %q, %v", id, b, err)
		}
		// The counter is the same process, with the same PID, everywhere.
		if p, err := s.agent(t, id).c.Process(ctx, proc.PID); err != nil || !p.Running {
			t.Errorf("counter process %d in %s: %+v, %v", proc.PID, id, p, err)
		}
	}
	// The copies diverge: stopping the counter in one leaves the others
	// counting, and a file written in one is in no other.
	if err := s.agent(t, copies[0]).c.Signal(ctx, proc.PID, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.agent(t, copies[0]).c.Wait(ctx, proc.PID); err != nil {
		t.Fatal(err)
	}
	if err := s.agent(t, copies[1]).writeFile(ctx, "/root/mine", []byte(copies[1])); err != nil {
		t.Fatal(err)
	}
	stopped, running := counter(copies[0]), counter(copies[1])
	time.Sleep(500 * time.Millisecond)
	if n := counter(copies[0]); n != stopped {
		t.Errorf("counter in %s moved from %d to %d after it was killed there", copies[0], stopped, n)
	}
	if n := counter(copies[1]); n <= running {
		t.Errorf("counter in %s stayed at %d after it was killed in %s", copies[1], n, copies[0])
	}
	for _, id := range []string{orig, copies[0]} {
		if _, err := s.agent(t, id).readFile(ctx, "/root/mine"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("reading %s's file in %s = %v, want ErrNotFound", copies[1], id, err)
		}
	}
	// Without leaveRunning the original stops.
	if err := cp.Checkpoint(ctx, orig, t.TempDir(), false); err != nil {
		t.Fatalf("Checkpoint(%s) without leaving it running: %v", orig, err)
	}
	s.wantStatus(t, orig, driver.StatusStopped)
}
