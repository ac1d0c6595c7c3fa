package sandbox

import (
	"context"
	"errors"
	"github.com/corralrun/corral/internal/admission"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// waitPool waits until pool name satisfies ok and returns its status.
func waitPool(t *testing.T, m *Manager, name string, ok func(PoolStatus) bool) PoolStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := m.PoolStatus(name)
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never got there: %+v", name, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readyN(n int) func(PoolStatus) bool {
	return func(st PoolStatus) bool { return st.Ready == n && st.Filling == 0 }
}

func memberIDs(m *Manager) []string {
	var ids []string
	for _, sb := range m.List(context.Background(), Filter{Pooled: true}) {
		if sb.Pool != "" {
			ids = append(ids, sb.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func TestPoolClaim(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxTimeout = time.Hour })
	ctx := t.Context()
	st, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := Pool{Name: "p", Template: "tiny", Runtime: "fake", MilliCPUs: 1000, MemoryBytes: 256 << 20, Pids: 100, Network: egress.ModeNone, Size: 2}
	if diff := cmp.Diff(want, st.Pool); diff != "" {
		t.Fatalf("pool with defaults (-want +got):\n%s", diff)
	}
	waitPool(t, h.m, "p", readyN(2))
	members := memberIDs(h.m)
	if len(members) != 2 {
		t.Fatalf("members %v", members)
	}
	// Members are hidden from users.
	if got := h.m.List(context.Background(), Filter{}); len(got) != 0 {
		t.Fatalf("List shows pool members: %+v", got)
	}
	if _, err := h.m.Get(context.Background(), members[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get of a member: %v", err)
	}
	if err := h.m.Exec(ctx, members[0], wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Exec in a member: %v", err)
	}
	if _, err := h.m.Agent(context.Background(), members[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Agent of a member: %v", err)
	}
	for _, id := range members {
		if sb := h.store.sandbox(id); !sb.Deadline.IsZero() {
			t.Fatalf("member %s has a deadline %s", id, sb.Deadline)
		}
	}

	// A create of the pool's shape claims a member, with its own settings.
	h.now.Add(time.Hour)
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Env: map[string]string{"GREETING": "hi"},
		Metadata: map[string]string{"k": "v"}, Timeout: ptr(10 * time.Minute), IdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(members, sb.ID) {
		t.Fatalf("create did not claim a member: %s not in %v", sb.ID, members)
	}
	if sb.Pool != "" || sb.Metadata["k"] != "v" || sb.IdleTimeout != time.Minute || !sb.CreatedAt.Equal(h.now.Now()) {
		t.Fatalf("claimed %+v", sb)
	}
	if want := h.now.Now().Add(10 * time.Minute); !sb.Deadline.Equal(want) {
		t.Fatalf("claimed deadline %s, want %s", sb.Deadline, want)
	}
	if rec := h.store.sandbox(sb.ID); rec.Pool != "" || rec.Env["GREETING"] != "hi" {
		t.Fatalf("store holds %+v", rec)
	}
	if got := execStdout(t, h, sb.ID, wire.ExecRequest{Shell: "echo $GREETING"}); got != "hi\n" {
		t.Fatalf("claimed env: %q", got)
	}
	if got := h.m.List(context.Background(), Filter{}); len(got) != 1 || got[0].ID != sb.ID {
		t.Fatalf("List after claim: %+v", got)
	}
	waitPool(t, h.m, "p", readyN(2))

	// Another shape is a cold create; an explicit pool with lower limits
	// claims and lowers them.
	cold, err := h.m.Create(ctx, Spec{Template: "tiny", MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(memberIDs(h.m), cold.ID) || slices.Contains(members, cold.ID) {
		t.Fatalf("a create of another shape claimed %s", cold.ID)
	}
	before := memberIDs(h.m)
	small, err := h.m.Create(ctx, Spec{Pool: "p", MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(before, small.ID) || small.MemoryBytes != 128<<20 {
		t.Fatalf("explicit claim %+v from %v", small, before)
	}
	if r, _ := h.drv.Resources(small.ID); r.MemoryBytes != 128<<20 {
		t.Fatalf("driver limits after claim %+v", r)
	}

	for _, tt := range []struct {
		name string
		spec Spec
		want error
	}{
		{"unknown pool", Spec{Pool: "nope"}, errdefs.ErrNotFound},
		{"above the shape", Spec{Pool: "p", MemoryBytes: 512 << 20}, errdefs.ErrInvalidArgument},
		{"other template", Spec{Pool: "p", Template: "other"}, errdefs.ErrInvalidArgument},
		{"bad env", Spec{Template: "tiny", Env: map[string]string{"A=B": "x"}}, errdefs.ErrInvalidArgument},
		{"timeout over max", Spec{Template: "tiny", Timeout: ptr(2 * time.Hour)}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := h.m.Create(ctx, tt.spec); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	waitPool(t, h.m, "p", readyN(2))

	// A pooled sandbox is never reused: deleting a claimed one destroys it.
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(memberIDs(h.m), sb.ID) {
		t.Fatal("a deleted claimed sandbox went back to the pool")
	}
	if err := h.m.DeleteTemplate(ctx, "tiny"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pool(s) p") {
		t.Fatalf("deleting the template of a pool: %v", err)
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if ids := memberIDs(h.m); len(ids) != 0 {
		t.Fatalf("members left after RemovePool: %v", ids)
	}
	if _, err := h.m.PoolStatus("p"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removed pool: %v", err)
	}
	for _, id := range []string{cold.ID, small.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	h.assertClean(t)
}

func TestPoolMissAndResize(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", MemoryBytes: 64 << 20, Size: 0}); err != nil {
		t.Fatal(err)
	}
	// An empty pool named explicitly: a cold create of its shape.
	sb, err := h.m.Create(ctx, Spec{Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.MemoryBytes != 64<<20 || sb.Template != "tiny" || sb.Pool != "" {
		t.Fatalf("cold create from an empty pool: %+v", sb)
	}
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", MemoryBytes: 64 << 20, Size: 3}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(3))
	old := memberIDs(h.m)
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", MemoryBytes: 64 << 20, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if got := memberIDs(h.m); len(got) != 1 || !slices.Contains(old, got[0]) {
		t.Fatalf("members after shrinking: %v (had %v)", got, old)
	}
	// A new shape replaces every member.
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", MemoryBytes: 32 << 20, Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(1))
	got := memberIDs(h.m)
	if len(got) != 1 || slices.Contains(old, got[0]) {
		t.Fatalf("members after a new shape: %v (had %v)", got, old)
	}
	for _, tt := range []struct {
		name string
		def  Pool
		want error
	}{
		{"bad name", Pool{Name: "Bad Name", Template: "tiny"}, errdefs.ErrInvalidArgument},
		{"too big", Pool{Name: "q", Template: "tiny", Size: MaxPoolSize + 1}, errdefs.ErrInvalidArgument},
		{"no template", Pool{Name: "q", Template: "nope"}, errdefs.ErrNotFound},
		{"unknown runtime", Pool{Name: "q", Template: "tiny", Runtime: "qemu"}, errdefs.ErrInvalidArgument},
		{"network without support", Pool{Name: "q", Template: "tiny", Network: egress.ModeOpen}, errdefs.ErrFailedPrecondition},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := h.m.SetPool(ctx, tt.def); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestPoolBacksOff(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	boom := errors.New("boom")
	h.setFailDriver(func(string) error { return boom })
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 2}); err != nil {
		t.Fatal(err)
	}
	st := waitPool(t, h.m, "p", func(st PoolStatus) bool { return st.Error != "" && st.Filling == 0 })
	if !strings.Contains(st.Error, "boom") || st.RetryAt.Before(h.now.Now()) || st.Ready != 0 {
		t.Fatalf("status after a failure: %+v", st)
	}
	// Nothing is retried before RetryAt (the clock does not move)...
	calls := len(h.drv.Calls())
	h.m.kickPools()
	time.Sleep(50 * time.Millisecond)
	if got := len(h.drv.Calls()); got != calls {
		t.Fatalf("refill retried during back-off: %d driver calls, had %d", got, calls)
	}
	// ...and everything after it, once the driver works again.
	h.setFailDriver(nil)
	h.now.Add(poolBackoff(st.Filling + 10))
	h.m.kickPools()
	st = waitPool(t, h.m, "p", readyN(2))
	if st.Error != "" {
		t.Fatalf("error kept after a success: %+v", st)
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestPoolBackoffDurations(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 9; n++ {
		got = append(got, poolBackoff(n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("back-off (-want +got):\n%s", diff)
	}
}

func TestPoolSurvivesRestart(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.SetPool(ctx, Pool{Name: "gone", Template: "tiny", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(3))
	waitPool(t, h.m, "gone", readyN(1))
	members := memberIDs(h.m)
	h.m.Close()
	// While the daemon is down: one member dies, and pool "gone" is
	// forgotten (its member must be deleted).
	var p []string
	for _, id := range members {
		if h.store.sandbox(id).Pool == "p" {
			p = append(p, id)
		}
	}
	if err := h.drv.Kill(p[0]); err != nil {
		t.Fatal(err)
	}
	_ = h.store.DeletePool(ctx, "gone")

	h.start(t)
	st := waitPool(t, h.m, "p", readyN(3))
	if st.Error != "" {
		t.Fatalf("status after restart: %+v", st)
	}
	got := memberIDs(h.m)
	for _, id := range p[1:] {
		if !slices.Contains(got, id) {
			t.Fatalf("live member %s was not adopted: %v", id, got)
		}
	}
	if slices.Contains(got, p[0]) {
		t.Fatalf("dead member %s adopted", p[0])
	}
	if len(h.m.Pools()) != 1 {
		t.Fatalf("pools after restart: %+v", h.m.Pools())
	}
	// An adopted member is claimable.
	sb, err := h.m.Create(ctx, Spec{Pool: "p"})
	if err != nil || !slices.Contains(got, sb.ID) {
		t.Fatalf("claim after restart: %v %+v", err, sb)
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestPoolNetworkClaim(t *testing.T) {
	h, fn := newNetHarness(t, nil)
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "net", Template: "tiny", Network: egress.ModeAllowlist, Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "net", readyN(1))
	members := memberIDs(h.m)
	// Mode none does not fit a pool with a network: cold create.
	none, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(members, none.ID) {
		t.Fatal("a create with network none claimed a member with a network")
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Network: egress.Policy{Domains: []egress.DomainRule{{Name: "example.com"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(members, sb.ID) {
		t.Fatalf("create with rules did not claim: %s not in %v", sb.ID, members)
	}
	if p := fn.Policy(sb.ID); len(p.Domains) != 1 || p.Domains[0].Name != "example.com" {
		t.Fatalf("host policy after claim: %+v", p)
	}
	if _, err := h.m.Create(ctx, Spec{Pool: "net", Network: egress.Policy{Mode: egress.ModeNone}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("explicit claim with mode none: %v", err)
	}
	if err := h.m.RemovePool(ctx, "net"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{none.ID, sb.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertNetClean(t, h, fn)
}

// A member whose agent does not answer is deleted at claim and the create
// goes on with the next member, or cold.
func TestPoolClaimSkipsDeadMember(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(1))
	dead := memberIDs(h.m)[0]
	if err := h.drv.Kill(dead); err != nil {
		t.Fatal(err)
	}
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == dead {
		t.Fatal("claimed a dead member")
	}
	if _, err := h.m.entry(context.Background(), dead); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("dead member kept: %v", err)
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

// TestPoolAdmission checks that warm pool members count against host
// capacity but not against any caller's limit, and that a claim counts
// against the claimer's limit as a cold create would.
func TestPoolAdmission(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.MaxTimeout = time.Hour
		c.Admission = admission.Config{MaxSandboxes: 3, MaxPerPrincipal: 1}
	})
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(2)) // two members, no caller charged

	a := admission.WithPrincipal(ctx, "a")
	sb, err := h.m.Create(a, Spec{Template: "tiny"})
	if err != nil {
		t.Fatalf("first claim of a: %v", err)
	}
	if sb.Owner != "a" || h.store.sandbox(sb.ID).Owner != "a" {
		t.Fatalf("claimed sandbox owner %q (stored %q), want a", sb.Owner, h.store.sandbox(sb.ID).Owner)
	}
	// a is at its limit: neither a claim nor a cold create may pass.
	if _, err := h.m.Create(a, Spec{Template: "tiny"}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("second create of a: %v, want resource exhausted", err)
	}
	// The refill and b's claim share the host's 3: the claimed sandbox,
	// the remaining member, and one refilled member or b's.
	b := admission.WithPrincipal(ctx, "b")
	if _, err := h.m.Create(b, Spec{Template: "tiny"}); err != nil {
		t.Fatalf("claim of b: %v", err)
	}
	if got := len(h.m.List(context.Background(), Filter{Pooled: true})); got > 3 {
		t.Fatalf("%d sandboxes exist with a limit of 3", got)
	}
	c := admission.WithPrincipal(ctx, "c")
	waitPool(t, h.m, "p", func(st PoolStatus) bool { return st.Ready == 1 })
	if _, err := h.m.Create(c, Spec{Template: "tiny"}); err != nil {
		t.Fatalf("claim of c from the last member: %v", err)
	}
	if _, err := h.m.Create(admission.WithPrincipal(ctx, "d"), Spec{Template: "tiny", Pids: 7}); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("cold create over host capacity: %v, want busy", err)
	}
	if hits, misses := h.m.Metrics().PoolHits.Value(), h.m.Metrics().PoolMisses.Value(); hits != 3 || misses != 1 {
		t.Fatalf("pool hits %v misses %v, want 3 and 1", hits, misses)
	}
	// Deleting gives the caller's count back, and room for the refill
	// once its back-off (the host was full) is over.
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.now.Add(time.Minute)
	h.m.kickPools()
	waitPool(t, h.m, "p", func(st PoolStatus) bool { return st.Ready == 1 })
	if _, err := h.m.Create(a, Spec{Template: "tiny"}); err != nil {
		t.Fatalf("claim of a after its delete: %v", err)
	}
}

// TestPoolRefillDelay: after a claim the pool makes the replacement only
// once PoolRefillDelay has passed, so that the claimer's first requests do
// not compete with it.
func TestPoolRefillDelay(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.PoolRefillDelay = 20 * time.Millisecond })
	ctx := t.Context()
	if _, err := h.m.SetPool(ctx, Pool{Name: "p", Template: "tiny", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.m, "p", readyN(1))
	members := memberIDs(h.m)
	sb, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(members, sb.ID) {
		t.Fatalf("create did not claim: %s not in %v", sb.ID, members)
	}
	// The delay's timer has fired and woken the pool, but the clock says
	// the delay has not passed.
	time.Sleep(100 * time.Millisecond)
	if st, _ := h.m.PoolStatus("p"); st.Ready+st.Filling != 0 {
		t.Fatalf("refilled before the delay: %+v", st)
	}
	h.now.Add(20 * time.Millisecond)
	h.m.kickPools()
	waitPool(t, h.m, "p", readyN(1))

	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.RemovePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}
