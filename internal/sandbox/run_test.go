package sandbox

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// earlyProbe is the fake driver counting the connections made to agents,
// whose Create returns only once the first of them was made, or never
// calls Started when silent is set. With fail set, Create fails after
// that first connection.
type earlyProbe struct {
	*fake.Driver
	t      *testing.T
	silent bool
	fail   error
	dials  atomic.Int32
}

func (d *earlyProbe) Create(ctx context.Context, spec driver.Spec) error {
	if d.silent {
		spec.Started = nil
	}
	if err := d.Driver.Create(ctx, spec); err != nil {
		return err
	}
	if spec.Started != nil {
		// The request goes out while the create is still under way.
		testutil.WaitFor(d.t, func() bool { return d.dials.Load() > 0 })
	}
	if d.fail != nil {
		return errors.Join(d.fail, d.Driver.Delete(ctx, spec.ID))
	}
	return nil
}

func (d *earlyProbe) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	d.dials.Add(1)
	return d.Driver.DialAgent(ctx, id)
}

func newProbeHarness(t *testing.T, silent bool) (*harness, *earlyProbe) {
	var p *earlyProbe
	h := newHarness(t, func(c *Config) {
		p = &earlyProbe{Driver: c.Drivers[0].(*fake.Driver), t: t, silent: silent}
		c.Drivers = []driver.Driver{p}
	})
	return h, p
}

// runEvents is what Run handed its two callbacks, in order.
type runEvents struct {
	created  Sandbox
	order    []string
	out      strings.Builder
	exitCode *int
}

func (r *runEvents) onCreated(sb Sandbox) error {
	r.created = sb
	r.order = append(r.order, "created")
	return nil
}

func (r *runEvents) onEvent(ev wire.ExecEvent) error {
	r.order = append(r.order, string(ev.Type))
	switch ev.Type {
	case wire.EventStdout:
		r.out.Write(ev.Bytes())
	case wire.EventExit:
		r.exitCode = ev.ExitCode
	}
	return nil
}

func TestRun(t *testing.T) {
	for _, silent := range []bool{false, true} {
		name := "early"
		if silent {
			name = "driver does not tell"
		}
		t.Run(name, func(t *testing.T) {
			h, p := newProbeHarness(t, silent)
			ctx := t.Context()
			var got runEvents
			sb, err := h.m.Run(ctx, Spec{Template: "tiny", Env: map[string]string{"A": "1"}},
				wire.ExecRequest{Shell: "echo $A$B; exit 3", Env: map[string]string{"B": "2"}}, got.onCreated, got.onEvent)
			if err != nil {
				t.Fatal(err)
			}
			if sb.ID == "" || sb.State != StateRunning || got.created.ID != sb.ID {
				t.Fatalf("run returned %+v, created got %+v", sb, got.created)
			}
			if got.out.String() != "12\n" || got.exitCode == nil || *got.exitCode != 3 {
				t.Fatalf("output %q exit %v", got.out.String(), got.exitCode)
			}
			if got.order[0] != "created" || got.order[1] != string(wire.EventStart) || got.order[len(got.order)-1] != string(wire.EventExit) {
				t.Fatalf("events in order %v", got.order)
			}
			// The exec was the agent's first round trip; the create did not
			// warm a connection of its own.
			if n := p.dials.Load(); !silent && n != 1 {
				t.Fatalf("%d connections to the agent, want 1", n)
			}
			if err := h.m.Delete(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			h.assertClean(t)
		})
	}
}

// TestRunCreateFails checks that a create failing after the exec request
// went out ends that exec and leaves nothing behind.
func TestRunCreateFails(t *testing.T) {
	h, p := newProbeHarness(t, false)
	boom := errors.New("boom")
	h.store.failPut = func(sb Sandbox) error {
		if sb.State == StateRunning {
			return boom
		}
		return nil
	}
	var got runEvents
	sb, err := h.m.Run(t.Context(), Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"sleep", "600"}}, got.onCreated, got.onEvent)
	if !errors.Is(err, boom) || sb.ID != "" {
		t.Fatalf("run: %+v, %v; want boom and no sandbox", sb, err)
	}
	if len(got.order) != 0 || p.dials.Load() != 1 {
		t.Fatalf("callbacks got %v after %d connections; want none after 1", got.order, p.dials.Load())
	}
	h.store.failPut = nil
	h.assertClean(t)

	p.fail = boom
	if _, err := h.m.Run(t.Context(), Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"sleep", "600"}}, got.onCreated, got.onEvent); !errors.Is(err, boom) {
		t.Fatalf("run on a driver failing after Started: %v", err)
	}
	if len(got.order) != 0 {
		t.Fatalf("callbacks got %v", got.order)
	}
	h.assertClean(t)
	p.fail = nil

	h.setFailDriver(func(string) error { return boom })
	if _, err := h.m.Run(t.Context(), Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"true"}}, got.onCreated, got.onEvent); !errors.Is(err, boom) {
		t.Fatalf("run on a failing driver: %v", err)
	}
	h.assertClean(t)
}

func TestRunErrorsAfterCreate(t *testing.T) {
	h, _ := newProbeHarness(t, false)
	ctx := t.Context()

	// A command that cannot start: the sandbox exists and is returned.
	var got runEvents
	sb, err := h.m.Run(ctx, Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"definitely-not-a-command"}}, got.onCreated, got.onEvent)
	if !errors.Is(err, errdefs.ErrNotFound) || sb.ID == "" || got.created.ID != sb.ID {
		t.Fatalf("run of a missing command: %+v, %v", sb, err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// The caller refusing the sandbox ends the exec before any event.
	refused := errors.New("gone")
	var events []wire.ExecEvent
	sb, err = h.m.Run(ctx, Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"sleep", "600"}},
		func(Sandbox) error { return refused }, func(ev wire.ExecEvent) error { events = append(events, ev); return nil })
	if !errors.Is(err, refused) || sb.ID == "" || len(events) != 0 {
		t.Fatalf("run refused by its caller: %+v, %v, events %v", sb, err, events)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// A bad request fails before anything is made.
	if _, err := h.m.Run(ctx, Spec{Template: "tiny"}, wire.ExecRequest{Cmd: []string{"true"}, MaxOutputBytes: -1}, got.onCreated, got.onEvent); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("negative output limit: %v", err)
	}
	h.assertClean(t)
}
