package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// serviceTemplate makes template name whose service runs in work, a host
// directory (the fake driver runs processes on the host): it appends a
// line to "starts", writes its PID to "pid" and its view of $A and $B to
// "env", and creates "ready" a moment later, which its ready check waits
// for.
func serviceTemplate(t *testing.T, h *harness, name, work string) {
	t.Helper()
	sv := &Service{
		Shell: `echo $$ > pid; echo "$A $B" > env; echo start >> starts; sleep 0.3; touch ready; exec sleep 100`,
		Ready: &wire.ReadyCheck{Shell: "test -f ready", IntervalMS: 20},
	}
	tmpl := Template{Name: name, Source: "test", Service: sv,
		Defaults: &Defaults{Env: []string{"A=image", "B=image"}, WorkingDir: work}}
	if _, err := h.m.CreateTemplateFrom(t.Context(), tmpl, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func readWork(t *testing.T, work, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(work, name))
	if err != nil {
		t.Fatalf("service file: %v", err)
	}
	return string(b)
}

// checkGone waits until the process whose PID the service wrote to
// work/pid has ended: removing a sandbox ends its service.
func checkGone(t *testing.T, work string) {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(readWork(t, work, "pid")))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("service process %d outlived its sandbox", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkServiceReady checks that sandbox id's service is ready and that it
// has started n times in work (n < 0: any number).
func checkServiceReady(t *testing.T, h *harness, id, work string, n int) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(work, "ready")); err != nil {
		t.Fatalf("sandbox running before its service was ready: %v", err)
	}
	if got := strings.Count(readWork(t, work, "starts"), "start"); n >= 0 && got != n {
		t.Fatalf("service started %d times, want %d", got, n)
	}
	st, err := h.m.ServiceStatus(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != wire.ServiceReady || st.PID == 0 || st.ReadyAt == nil {
		t.Fatalf("service status %+v, want ready", st)
	}
}

func TestServiceReadyBeforeRunning(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	work := t.TempDir()
	serviceTemplate(t, h, "svc", work)
	sb, err := h.m.Create(ctx, Spec{Template: "svc", Env: map[string]string{"B": "sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateRunning {
		t.Fatalf("created %s", sb.State)
	}
	checkServiceReady(t, h, sb.ID, work, 1)
	if got := readWork(t, work, "env"); got != "image sandbox\n" {
		t.Fatalf("service environment %q, want the template's under the sandbox's", got)
	}

	plain, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.ServiceStatus(ctx, plain.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("service of a template without one: %v, want not found", err)
	}
	if _, err := h.m.ServiceStatus(ctx, "nosuchsandbox000"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("service of no sandbox: %v, want not found", err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, work)
	h.mustStop(t, plain.ID)
	if _, err := h.m.ServiceStatus(ctx, plain.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("service of a stopped sandbox: %v, want failed precondition", err)
	}
	if err := h.m.Delete(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestServiceNeverReady(t *testing.T) {
	tests := []struct {
		name    string
		sv      Service
		within  time.Duration
		wantOut string
	}{
		{"check never passes", Service{Shell: "echo $$ > pid; echo warming up; exec sleep 100",
			Ready: &wire.ReadyCheck{Shell: "false", IntervalMS: 20}, ReadyTimeoutMS: 500}, 5 * time.Second, "warming up"},
		{"command exits at once", Service{Shell: "echo $$ > pid; echo cannot start >&2; exit 3",
			Ready: &wire.ReadyCheck{Shell: "false", IntervalMS: 20}, ReadyTimeoutMS: 60_000}, 10 * time.Second, "cannot start"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			work := t.TempDir()
			tmpl := Template{Name: "never", Source: "test", Service: &tt.sv, Defaults: &Defaults{WorkingDir: work}}
			if _, err := h.m.CreateTemplateFrom(t.Context(), tmpl, func(string) error { return nil }); err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			_, err := h.m.Create(t.Context(), Spec{Template: "never"})
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("create: %v, want failed precondition", err)
			}
			if msg := err.Error(); !strings.Contains(msg, `template "never": service not ready`) || !strings.Contains(msg, tt.wantOut) {
				t.Fatalf("error %q: want the template and the output %q", msg, tt.wantOut)
			}
			if d := time.Since(begin); d > tt.within {
				t.Fatalf("create failed after %s, want within %s", d, tt.within)
			}
			checkGone(t, work)
			h.assertClean(t)
		})
	}
}

func TestServiceStartsAgainFromFilesSnapshot(t *testing.T) {
	h, _ := newSnapHarness(t)
	ctx := t.Context()
	work := t.TempDir()
	serviceTemplate(t, h, "svc", work)
	src, err := h.m.Create(ctx, Spec{Template: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Snapshot(ctx, src.ID, SnapshotSpec{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, work)
	if err := os.Remove(filepath.Join(work, "ready")); err != nil {
		t.Fatal(err)
	}
	cp, err := h.m.Create(ctx, Spec{FromSnapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	checkServiceReady(t, h, cp.ID, work, 2)

	if err := os.Remove(filepath.Join(work, "ready")); err != nil {
		t.Fatal(err)
	}
	copies, err := h.m.Fork(ctx, cp.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkServiceReady(t, h, copies[0].ID, work, 3)
	for _, id := range []string{cp.ID, copies[0].ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.m.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestServiceStartsAgainAfterStop(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	work := t.TempDir()
	serviceTemplate(t, h, "svc", work)
	sb, err := h.m.Create(ctx, Spec{Template: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	checkGone(t, work)
	if err := os.Remove(filepath.Join(work, "ready")); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkServiceReady(t, h, sb.ID, work, 2)

	// A start whose service fails stays stopped, with nothing running.
	h.mustStop(t, sb.ID)
	if _, err := h.m.SetTemplateService(ctx, "svc", &Service{Shell: "echo $$ > pid; echo broken; exit 1",
		Ready: &wire.ReadyCheck{Shell: "false", IntervalMS: 20}, ReadyTimeoutMS: 5000}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.StartSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("start with a failing service: %v, want failed precondition with the output", err)
	}
	h.checkStopped(t, sb.ID)
	checkGone(t, work)
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestServiceRunWaits checks that Run's command starts only once the
// service is ready.
func TestServiceRunWaits(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	work := t.TempDir()
	serviceTemplate(t, h, "svc", work)
	var out strings.Builder
	sb, err := h.m.Run(ctx, Spec{Template: "svc"}, wire.ExecRequest{Shell: "test -f ready && echo ready"},
		func(Sandbox) error { return nil },
		func(ev wire.ExecEvent) error {
			if ev.Type == wire.EventStdout {
				out.Write(ev.Bytes())
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "ready\n" {
		t.Fatalf("run output %q: the command ran before the service was ready", out.String())
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestServicePool(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	work := t.TempDir()
	serviceTemplate(t, h, "svc", work)
	if _, err := h.m.SetPool(ctx, Pool{Name: "up", Template: "svc", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "up", readyN(1))
	sb, err := h.m.Create(ctx, Spec{Pool: "up"})
	if err != nil {
		t.Fatal(err)
	}
	checkServiceReady(t, h, sb.ID, work, -1) // the refill may have started another
	if err := h.m.RemovePool(ctx, "up"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	never := &Service{Shell: "echo still booting; exec sleep 100", Ready: &wire.ReadyCheck{Shell: "false", IntervalMS: 20}, ReadyTimeoutMS: 200}
	tmpl := Template{Name: "never", Source: "test", Service: never, Defaults: &Defaults{WorkingDir: work}}
	if _, err := h.m.CreateTemplateFrom(ctx, tmpl, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.SetPool(ctx, Pool{Name: "down", Template: "never", Size: 1}); err != nil {
		t.Fatal(err)
	}
	st := waitPool(t, h.m, "down", func(st PoolStatus) bool { return st.Error != "" && st.Filling == 0 })
	if !strings.Contains(st.Error, "service not ready") || !strings.Contains(st.Error, "still booting") || !st.RetryAt.After(h.now.Now()) || st.Ready != 0 {
		t.Fatalf("pool status %+v: want a back-off saying why", st)
	}
	if err := h.m.RemovePool(ctx, "down"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}
