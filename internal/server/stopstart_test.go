package server

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/admission"
	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

func TestStopStartOverHTTP(t *testing.T) {
	c, _ := newTestServer(t, "", func(cfg *sandbox.Config) { cfg.Admission = admission.Config{MaxSandboxes: 1} })
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", OnIdle: corral.ActionStop, IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if sb.OnIdle != corral.ActionStop {
		t.Fatalf("on_idle %q", sb.OnIdle)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/kept", strings.NewReader("yes"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stop(ctx, sb.ID)
	if err != nil || st.State != corral.StateStopped || st.ID != sb.ID || st.Deadline != nil {
		t.Fatalf("stop: %v %+v", err, st)
	}
	_, err = c.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"})
	if corral.ErrorCode(err) != corral.CodeFailedPrecondition || !strings.Contains(err.Error(), "is stopped; start it first") {
		t.Fatalf("exec while stopped: %v", err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/kept"); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Fatalf("read while stopped: %v", err)
	}
	if ls, err := c.List(ctx, corral.ListOptions{State: corral.StateStopped}); err != nil || len(ls) != 1 || ls[0].ID != sb.ID {
		t.Fatalf("list of stopped sandboxes: %v %+v", err, ls)
	}
	// The stopped sandbox frees the server's only place...
	other, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatalf("create while the other sandbox is stopped: %v", err)
	}
	// ...so that its start is refused while another holds it.
	if _, err := c.Start(ctx, sb.ID, nil); corral.ErrorCode(err) != corral.CodeBusy {
		t.Fatalf("start on a full server: %v", err)
	}
	if err := c.Delete(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, sb.ID, corral.Timeout(-time.Second)); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("start with a negative timeout: %v", err)
	}
	r, err := c.Start(ctx, sb.ID, corral.Timeout(time.Hour))
	if err != nil || r.State != "running" || r.Deadline == nil || time.Until(*r.Deadline) < 59*time.Minute {
		t.Fatalf("start: %v %+v", err, r)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "/kept")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err != nil || string(b) != "yes" {
		t.Fatalf("file after start: %q %v", b, err)
	}
	if _, err := c.Stop(ctx, "nosuchsandbox"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("stop of an unknown sandbox: %v", err)
	}
}

// TestStopStartEvents follows a stream filtered to stopped and started
// events: both are types a filter may name, and both arrive.
func TestStopStartEvents(t *testing.T) {
	c, _ := newTestServer(t, "")
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Events(ctx, corral.EventOptions{SandboxID: sb.ID, Types: []string{corral.EventStopped, corral.EventStarted}})
	if err != nil {
		t.Fatalf("events of types stopped and started: %v", err)
	}
	defer stream.Close()
	if _, err := c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{corral.EventStopped, corral.EventStarted} {
		ev, err := stream.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != want || ev.SandboxID != sb.ID {
			t.Errorf("event %+v, want %s of %s", ev, want, sb.ID)
		}
	}
}
