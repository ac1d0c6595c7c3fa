package fake

import (
	"errors"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/drivertest"
)

func TestMain(m *testing.M) {
	// Every agent goroutine and connection must be gone after each test.
	goleak.VerifyTestMain(m)
}

func newDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	root, err := os.MkdirTemp("", "fake")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	cfg.Root = root
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		New:    func(t *testing.T) driver.Driver { return newDriver(t, Config{}) },
		RootFS: func(t *testing.T) string { return t.TempDir() },
		// The fake enforces no limits, isolates no processes, freezes
		// nothing and binds no mounts: those cases are skipped by
		// declaration.
		Features: drivertest.Features{},
	})
}

func TestFailCreate(t *testing.T) {
	d := newDriver(t, Config{FailCreate: func(id string) error {
		if id == "bad" {
			return ErrInjected
		}
		return nil
	}})
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "bad", RootFS: t.TempDir()}); !errors.Is(err, ErrInjected) {
		t.Fatalf("Create(bad) = %v, want ErrInjected", err)
	}
	if err := d.Create(ctx, driver.Spec{ID: "good", RootFS: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := d.List(ctx); len(ids) != 1 || ids[0] != "good" {
		t.Errorf("List() = %v, want [good]", ids)
	}
	want := []Call{{"Create", "bad"}, {"Create", "good"}}
	if got := d.Calls(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Calls() = %v, want %v", got, want)
	}
}

func TestKillStopsSandbox(t *testing.T) {
	d := newDriver(t, Config{})
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "k", RootFS: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill("k"); err != nil {
		t.Fatal(err)
	}
	if st, _ := d.Status(ctx, "k"); st != driver.StatusStopped {
		t.Errorf("Status after Kill = %s, want stopped", st)
	}
	if c, err := d.DialAgent(ctx, "k"); err == nil {
		c.Close()
		t.Error("DialAgent after Kill succeeded")
	}
	if err := d.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
}

func TestFailDeleteKeepsSandbox(t *testing.T) {
	d := newDriver(t, Config{FailDelete: func(string) error { return ErrInjected }})
	ctx := t.Context()
	if err := d.Create(ctx, driver.Spec{ID: "x", RootFS: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "x"); !errors.Is(err, ErrInjected) {
		t.Fatalf("Delete = %v, want ErrInjected", err)
	}
	if st, _ := d.Status(ctx, "x"); st != driver.StatusRunning {
		t.Errorf("Status after failed delete = %s, want running", st)
	}
	d.cfg.FailDelete = nil
}

func TestMountsRecorded(t *testing.T) {
	d := newDriver(t, Config{})
	ms := []driver.Mount{{Source: "/srv/data", Target: "/data", ReadOnly: true}, {Source: "/srv/out", Target: "/data/out"}}
	if err := d.Create(t.Context(), driver.Spec{ID: "m", RootFS: t.TempDir(), Mounts: ms}); err != nil {
		t.Fatal(err)
	}
	spec, err := d.Spec("m")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ms, spec.Mounts); diff != "" {
		t.Errorf("Spec(m).Mounts (-want +got):\n%s", diff)
	}
}
