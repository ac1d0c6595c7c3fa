package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/wire"
)

// TestOOMKilledEvent checks that an OOM kill the Manager learns of is
// published once: two execs whose processes die of the same kill give
// one event, and an instance that dies after a new kill gives another,
// with the sandbox's error saying why.
func TestOOMKilledEvent(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	sub := h.m.Events().Subscribe(events.Filter{SandboxID: sb.ID, Types: []string{events.OOMKilled}})
	defer sub.Close()
	published := func() int {
		n := 0
		for {
			select {
			case ev := <-sub.C():
				if ev.Type != events.OOMKilled || ev.SandboxID != sb.ID {
					t.Errorf("event %+v", ev)
				}
				n++
			default:
				return n
			}
		}
	}

	// Both processes wait for the go file, then die of SIGKILL after the
	// count rose.
	gate := filepath.Join(t.TempDir(), "go")
	script := `while [ ! -e ` + gate + ` ]; do sleep 0.01; done; kill -9 $$`
	var wg sync.WaitGroup
	started := make(chan struct{}, 2)
	killed := make([]bool, 2)
	for i := range killed {
		wg.Go(func() {
			err := h.m.Exec(ctx, sb.ID, wire.ExecRequest{Shell: script}, func(ev wire.ExecEvent) error {
				switch ev.Type {
				case wire.EventStart:
					started <- struct{}{}
				case wire.EventExit:
					killed[i] = ev.OOMKilled
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	<-started
	<-started
	if err := h.drv.SetStats(sb.ID, driver.Stats{OOMKills: 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !killed[0] || !killed[1] {
		t.Fatalf("exit events say oom_killed %v, want both", killed)
	}
	if n := published(); n != 1 {
		t.Fatalf("%d oom_killed events for one kill seen by two execs, want 1", n)
	}

	// The instance dies of a second kill.
	if err := h.drv.SetStats(sb.ID, driver.Stats{OOMKills: 2}); err != nil {
		t.Fatal(err)
	}
	got := h.killAndExec(t, sb.ID)
	if n := published(); n != 1 {
		t.Fatalf("%d oom_killed events for an instance that died of one, want 1", n)
	}
	if !strings.Contains(got.Error, "OOM kill") {
		t.Fatalf("after the instance died: %+v", got)
	}
}
