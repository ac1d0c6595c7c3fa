package drivertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

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
