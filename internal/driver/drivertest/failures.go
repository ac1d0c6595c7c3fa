package drivertest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// StartFailure is one way a sandbox's start can fail: the agent the
// sandbox runs, and how the driver or Create is set up around it. The
// FailedStart case creates a sandbox under it and checks that Create
// fails as described and leaves nothing behind.
type StartFailure struct {
	Name string
	// Agent is the shell script run as the sandbox's agent (after a
	// "#!/bin/sh" line); empty is a file that is not a program.
	Agent string
	// Timeout is the driver's start-up timeout; zero keeps its default.
	Timeout time.Duration
	// Cancel cancels Create's context this long after Create is called;
	// zero never does.
	Cancel time.Duration
	// MissingRoot gives Create a root file system that does not exist.
	MissingRoot bool
	// BreakRuntime asks the harness to make the driver's runtime fail
	// (gVisor: an unknown platform).
	BreakRuntime bool
	// Want is text the error must contain, and WantErr an error it must
	// wrap; empty and nil check nothing.
	Want    string
	WantErr error
}

// testFailedStarts runs each of the harness's start failures on a driver
// of its own.
func testFailedStarts(t *testing.T, h Harness) {
	if h.NewWithAgent == nil {
		t.Skip("the harness gives no NewWithAgent: the driver runs no agent program")
	}
	for _, f := range h.StartFailures {
		t.Run(f.Name, func(t *testing.T) {
			agent := filepath.Join(t.TempDir(), "agent")
			body := "#!/bin/sh\n" + f.Agent + "\n"
			if f.Agent == "" {
				body = "not an executable\n"
			}
			if err := os.WriteFile(agent, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			s := newSuiteWith(t, h, h.NewWithAgent(t, agent, f))
			testFailedStart(t, s, f)
		})
	}
}

func testFailedStart(t *testing.T, s *suite, f StartFailure) {
	id := s.newID("bad")
	rootfs := s.rootfs(t)
	ctx := t.Context()
	if f.Cancel > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(f.Cancel, cancel)
	}
	root := rootfs
	if f.MissingRoot {
		root = filepath.Join(rootfs, "missing")
	}
	t0 := time.Now()
	err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: root, Resources: driver.Resources{MemoryBytes: 64 << 20, Pids: 64}})
	if err == nil {
		t.Fatal("Create succeeded")
	}
	t.Logf("after %v: %v", time.Since(t0), err)
	if prefix := s.h.ErrorPrefix + id + ": "; !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("error %q lacks the prefix %q", err, prefix)
	}
	if f.Want != "" && !strings.Contains(err.Error(), f.Want) {
		t.Errorf("error %q does not contain %q", err, f.Want)
	}
	if f.WantErr != nil && !errors.Is(err, f.WantErr) {
		t.Errorf("error %q is not %v", err, f.WantErr)
	}
	s.nothingLeft(t, id, rootfs)
}

// nothingLeft runs the harness's check of what only the driver knows
// about id, if it has one; the suite's cleanup checks the rest.
func (s *suite) nothingLeft(t *testing.T, id, rootfs string) {
	t.Helper()
	if s.h.NothingLeft != nil {
		s.h.NothingLeft(t, s.d, id, rootfs)
	}
}

// testCreateRejects checks that a spec no instance can be made from is
// refused with ErrInvalidArgument, by Restore too when the driver has
// it, and leaves nothing behind.
func testCreateRejects(t *testing.T, s *suite) {
	ctx := t.Context()
	rootfs := s.rootfs(t)
	for _, id := range []string{"", "..", ".hidden", "a/b", "a b", strings.Repeat("x", 200)} {
		err := s.d.Create(ctx, driver.Spec{ID: id, RootFS: rootfs})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%q) = %v, want ErrInvalidArgument", id, err)
		}
	}
	if err := s.d.Create(ctx, driver.Spec{ID: "rel", RootFS: "relative/root"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Create with a relative root = %v, want ErrInvalidArgument", err)
	}
	if cp, ok := s.d.(driver.Checkpointer); ok {
		if err := cp.Restore(ctx, "x", driver.Spec{ID: "y", RootFS: rootfs}, t.TempDir()); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Restore with a mismatched ID = %v, want ErrInvalidArgument", err)
		}
		if err := cp.Restore(ctx, "x", driver.Spec{RootFS: rootfs}, t.TempDir()); err == nil {
			t.Error("Restore from an empty image succeeded")
		}
	}
	s.nothingLeft(t, "rel", rootfs)
}
