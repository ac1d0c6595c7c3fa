package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/errdefs"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

type harness struct {
	m       *Manager
	store   *memStore
	storage *storagefake.Backend
	drv     *fake.Driver
	now     *fakeClock
	cfg     Config

	mu         sync.Mutex
	failDriver func(id string) error
	failUpdate func(id string) error
}

func (h *harness) setFailDriver(f func(string) error) {
	h.mu.Lock()
	h.failDriver = f
	h.mu.Unlock()
}

func (h *harness) setFailUpdate(f func(string) error) {
	h.mu.Lock()
	h.failUpdate = f
	h.mu.Unlock()
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newHarness(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	sock, err := os.MkdirTemp("", "sbx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	h := &harness{
		store:   newMemStore(),
		storage: storagefake.New(t.TempDir()),
		now:     &fakeClock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)},
	}
	hook := func(f *func(string) error) func(string) error {
		return func(id string) error {
			h.mu.Lock()
			fail := *f
			h.mu.Unlock()
			if fail != nil {
				return fail(id)
			}
			return nil
		}
	}
	drv, err := fake.New(fake.Config{Root: sock, FailCreate: hook(&h.failDriver), FailUpdate: hook(&h.failUpdate)})
	if err != nil {
		t.Fatal(err)
	}
	h.drv = drv
	h.cfg = Config{Store: h.store, Storage: h.storage, Drivers: []driver.Driver{drv}, Now: h.now.Now, ReapInterval: time.Hour,
		Defaults: Limits{MilliCPUs: 1000, MemoryBytes: 256 << 20, Pids: 100}}
	if mod != nil {
		mod(&h.cfg)
	}
	h.start(t)
	if _, err := h.m.CreateTemplate(t.Context(), "tiny", "test", func(dir string) error {
		return os.WriteFile(dir+"/hello", []byte("hi"), 0o644)
	}); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatal(err)
	}
	return h
}

func (h *harness) start(t *testing.T) {
	t.Helper()
	m, err := New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.m = m
	t.Cleanup(func() {
		for _, sb := range m.List(context.Background(), Filter{Pooled: true}) {
			_ = m.Delete(context.Background(), sb.ID)
		}
		m.Close()
	})
}

// restartWithFailDelete restarts the Manager on a new fake driver whose
// Delete calls failDelete first.
func (h *harness) restartWithFailDelete(t *testing.T, failDelete func(string) error) {
	t.Helper()
	drv, err := fake.New(fake.Config{Root: t.TempDir(), FailDelete: failDelete})
	if err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.drv = drv
	h.cfg.Drivers = []driver.Driver{drv}
	h.start(t)
}

// assertClean checks that no sandbox resource is left anywhere.
func (h *harness) assertClean(t *testing.T) {
	t.Helper()
	if got := h.m.List(context.Background(), Filter{}); len(got) != 0 {
		t.Errorf("manager still lists %d sandboxes", len(got))
	}
	if recs, _ := h.store.Sandboxes(t.Context()); len(recs) != 0 {
		t.Errorf("store still holds %d sandboxes", len(recs))
	}
	if roots, _ := h.storage.Roots(t.Context()); len(roots) != 0 {
		t.Errorf("storage still holds roots %v", roots)
	}
	if ids, _ := h.drv.List(t.Context()); len(ids) != 0 {
		t.Errorf("driver still holds instances %v", ids)
	}
}

func TestCreateExecDelete(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Env: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateRunning || sb.Runtime != "fake" || sb.MemoryBytes != 256<<20 || sb.MilliCPUs != 1000 {
		t.Fatalf("created %+v", sb)
	}
	if want := h.now.Now().Add(5 * time.Minute); !sb.Deadline.Equal(want) {
		t.Fatalf("deadline %s, want default 5m: %s", sb.Deadline, want)
	}
	recs, _ := h.store.Sandboxes(ctx)
	if len(recs) != 1 || recs[0].State != StateRunning {
		t.Fatalf("store holds %+v", recs)
	}
	var out strings.Builder
	var exit wire.ExecEvent
	err = h.m.Exec(ctx, sb.ID, wire.ExecRequest{Shell: "echo $A$B", Env: map[string]string{"B": "2"}}, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout:
			out.Write(ev.Bytes())
		case wire.EventExit:
			exit = ev
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "12\n" || exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Fatalf("exec output %q exit %+v", out.String(), exit)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if err := h.m.Exec(ctx, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("exec after delete: %v", err)
	}
	h.assertClean(t)
}

func TestCreateRollsBack(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		mod  func(h *harness)
	}{
		{"storage fails", func(h *harness) { h.storage.SetFailCreateRoot(func(string) error { return boom }) }},
		{"driver fails", func(h *harness) { h.setFailDriver(func(string) error { return boom }) }},
		{"store fails to record creating", func(h *harness) {
			h.store.failPut = func(sb Sandbox) error {
				if sb.State == StateCreating {
					return boom
				}
				return nil
			}
		}},
		{"store fails to record running", func(h *harness) {
			h.store.failPut = func(sb Sandbox) error {
				if sb.State == StateRunning {
					return boom
				}
				return nil
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			tt.mod(h)
			_, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
			if !errors.Is(err, boom) {
				t.Fatalf("create error %v, want boom", err)
			}
			h.store.failPut = nil
			h.assertClean(t)
		})
	}
}

func TestDeadlines(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxTimeout = time.Hour })
	ctx := t.Context()
	short, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	long, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(30 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(2 * time.Hour)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("timeout over the maximum: %v", err)
	}
	if _, err := h.m.Create(ctx, Spec{Template: "tiny", Timeout: ptr(time.Duration(0))}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no deadline with a maximum set: %v", err)
	}
	h.now.Add(59 * time.Second)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), short.ID); err != nil {
		t.Fatalf("reaped before its deadline: %v", err)
	}
	// Reading and exec do not move the deadline.
	got, _ := h.m.Get(context.Background(), short.ID)
	if !got.Deadline.Equal(short.Deadline) {
		t.Fatalf("deadline moved: %s -> %s", short.Deadline, got.Deadline)
	}
	h.now.Add(2 * time.Second)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), short.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("expired sandbox still there: %v", err)
	}
	// An explicit SetTimeout is the way to extend.
	ext, err := h.m.SetTimeout(ctx, long.ID, 50*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := h.now.Now().Add(50 * time.Minute); !ext.Deadline.Equal(want) {
		t.Fatalf("extended deadline %s, want %s", ext.Deadline, want)
	}
	h.now.Add(40 * time.Minute)
	h.m.reapExpired()
	if _, err := h.m.Get(context.Background(), long.ID); err != nil {
		t.Fatalf("extended sandbox reaped early: %v", err)
	}
	h.now.Add(11 * time.Minute)
	h.m.reapExpired()
	h.assertClean(t)
}

func ptr[T any](v T) *T { return &v }

func TestLimitsAndValidation(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Max = Limits{MemoryBytes: 1 << 30, MilliCPUs: 2000} })
	tests := []struct {
		name string
		spec Spec
		kind error
	}{
		{"unknown template", Spec{Template: "nope"}, errdefs.ErrNotFound},
		{"no template", Spec{}, errdefs.ErrInvalidArgument},
		{"unknown runtime", Spec{Template: "tiny", Runtime: "vm"}, errdefs.ErrInvalidArgument},
		{"memory over max", Spec{Template: "tiny", MemoryBytes: 2 << 30}, errdefs.ErrInvalidArgument},
		{"memory under min", Spec{Template: "tiny", MemoryBytes: 1 << 20}, errdefs.ErrInvalidArgument},
		{"cpus over max", Spec{Template: "tiny", MilliCPUs: 4000}, errdefs.ErrInvalidArgument},
		{"negative pids", Spec{Template: "tiny", Pids: -1}, errdefs.ErrInvalidArgument},
		{"bad env name", Spec{Template: "tiny", Env: map[string]string{"A=B": "x"}}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.m.Create(t.Context(), tt.spec)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("error %v, want kind %v", err, tt.kind)
			}
		})
	}
	h.assertClean(t)
}

// TestReconcile simulates a daemon that died at every interesting point and
// checks what a new Manager makes of it.
func TestReconcile(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	alive, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	// A create that was interrupted after it recorded the sandbox and made
	// the root, and an orphan root the store never heard of.
	half := Sandbox{ID: "halfmade", Template: "tiny", Runtime: "fake", State: StateCreating}
	_ = h.store.PutSandbox(ctx, half)
	_, _ = h.storage.CreateRoot(ctx, "halfmade", "tiny", storageOpts())
	_, _ = h.storage.CreateRoot(ctx, "orphan", "tiny", storageOpts())
	// One instance died while the daemon was down.
	if err := h.drv.Kill(dead.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()

	m2, err := New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	var ids []string
	for _, sb := range m2.List(context.Background(), Filter{}) {
		ids = append(ids, sb.ID)
	}
	if diff := cmp.Diff([]string{alive.ID}, ids); diff != "" {
		t.Fatalf("sandboxes after reconcile (-want +got):\n%s", diff)
	}
	roots, _ := h.storage.Roots(ctx)
	if diff := cmp.Diff([]string{alive.ID}, roots); diff != "" {
		t.Fatalf("roots after reconcile (-want +got):\n%s", diff)
	}
	var ran bool
	err = m2.Exec(ctx, alive.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(ev wire.ExecEvent) error {
		ran = ran || ev.Type == wire.EventExit
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("exec in reattached sandbox: %v", err)
	}
	if err := m2.Delete(ctx, alive.ID); err != nil {
		t.Fatal(err)
	}
	h.m = m2
	h.assertClean(t)
}

func TestTemplates(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	if _, err := h.m.CreateTemplate(ctx, "Bad Name", "x", func(string) error { return nil }); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := h.m.CreateTemplate(ctx, "tiny", "x", func(string) error { return nil }); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate: %v", err)
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("deleting a template in use: %v", err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second template delete: %v", err)
	}
	if got := h.m.Templates(t.Context()); len(got) != 0 {
		t.Fatalf("templates left: %v", got)
	}
}

func TestConcurrentCreateDelete(t *testing.T) {
	h := newHarness(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := h.m.Create(context.Background(), Spec{Template: "tiny", Metadata: map[string]string{"i": fmt.Sprint(i)}})
			if err != nil {
				errs <- err
				return
			}
			errs <- h.m.Delete(context.Background(), sb.ID)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	h.assertClean(t)
}

// TestDeadInstanceBecomesErrorAndDeletes: when a sandbox's instance dies
// under the daemon, the next exec marks it as error with a reason, further
// calls say so at once, and delete still releases everything.
func TestDeadInstanceBecomesErrorAndDeletes(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.killAndExec(t, sb.ID); !strings.Contains(got.Error, "stopped unexpectedly") {
		t.Fatalf("after the instance died: %+v", got)
	}
	err = h.m.Exec(ctx, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec in an errored sandbox: %v", err)
	}
	if _, err := h.m.SetTimeout(ctx, sb.ID, time.Minute); err != nil {
		t.Fatalf("extending an errored sandbox: %v", err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// killAndExec kills sandbox id's instance, checks that the next exec
// finds it dead and the sandbox then in the error state, and returns it.
func (h *harness) killAndExec(t *testing.T, id string) Sandbox {
	t.Helper()
	if err := h.drv.Kill(id); err != nil {
		t.Fatal(err)
	}
	err := h.m.Exec(t.Context(), id, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("exec in a dead sandbox: %v", err)
	}
	got, _ := h.m.Get(context.Background(), id)
	if got.State != StateError {
		t.Fatalf("after the instance died: %+v", got)
	}
	return got
}

// TestFailedDeleteCanBeRetried: a delete that fails leaves the sandbox in
// error state with the reason, and a second delete finishes the job.
func TestFailedDeleteCanBeRetried(t *testing.T) {
	boom := errors.New("runtime hiccup")
	var fail atomic.Bool
	h := newHarness(t, nil)
	h.restartWithFailDelete(t, func(string) error {
		if fail.Load() {
			return boom
		}
		return nil
	})
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	if err := h.m.Delete(ctx, sb.ID); !errors.Is(err, boom) {
		t.Fatalf("delete error %v, want %v", err, boom)
	}
	got, _ := h.m.Get(context.Background(), sb.ID)
	if got.State != StateError || !strings.Contains(got.Error, "runtime hiccup") {
		t.Fatalf("after a failed delete: %+v", got)
	}
	fail.Store(false)
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// dialCounter is the fake driver counting the connections made to agents.
type dialCounter struct {
	*fake.Driver
	dials atomic.Int32
}

func (d *dialCounter) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	d.dials.Add(1)
	return d.Driver.DialAgent(ctx, id)
}

// TestCreateWarmsAgentConnection checks that a create opens a connection
// to the new sandbox's agent by itself, for the first exec to find in the
// agent client's pool (whether it does depends on timing, so it is not
// asserted).
func TestCreateWarmsAgentConnection(t *testing.T) {
	var dc *dialCounter
	h := newHarness(t, func(c *Config) {
		dc = &dialCounter{Driver: c.Drivers[0].(*fake.Driver)}
		c.Drivers = []driver.Driver{dc}
	})
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, func() bool { return dc.dials.Load() == 1 })
	if err := h.m.Exec(ctx, sb.ID, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
