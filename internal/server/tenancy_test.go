package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/metrics"
	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

// TestTenantsAreIsolated drives the API with an admin key and two tenants'
// keys: a tenant's sandboxes are not found by the other, admin routes
// refuse tenants, quotas refuse with 429, and revoked or rotated keys
// stop working, an open stream included.
func TestTenantsAreIsolated(t *testing.T) {
	admin, ts := newTestServer(t, "admin-secret")
	ctx := t.Context()
	newKey := func(o corral.KeyOptions) *corral.Client {
		t.Helper()
		k, err := admin.CreateKey(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(k.Key, "crl_") || k.Tenant == "" {
			t.Fatalf("created key %+v", k)
		}
		c, err := corral.New(ts.URL, k.Key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	a := newKey(corral.KeyOptions{Name: "team-a"})
	b := newKey(corral.KeyOptions{Name: "team-b", MaxSandboxes: 1, MaxMemoryMB: 256})

	sb, err := a.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Tenant != "team-a" {
		t.Fatalf("tenant of a's sandbox: %q", sb.Tenant)
	}
	notFound := func(what string, err error) {
		t.Helper()
		if corral.ErrorCode(err) != corral.CodeNotFound {
			t.Errorf("tenant b, %s of a's sandbox: %v, want not_found", what, err)
		}
	}
	_, err = b.Get(ctx, sb.ID)
	notFound("get", err)
	_, err = b.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"})
	notFound("exec", err)
	_, err = b.ReadFile(ctx, sb.ID, "/etc/hostname")
	notFound("read file", err)
	_, err = b.StartProcess(ctx, sb.ID, corral.StartOptions{Shell: "true"})
	notFound("start process", err)
	_, err = b.Pause(ctx, sb.ID)
	notFound("pause", err)
	_, err = b.CreateSnapshot(ctx, sb.ID, "b-snap", nil)
	notFound("snapshot", err)
	_, err = b.Fork(ctx, sb.ID, 1)
	notFound("fork", err)
	_, err = b.CodeContexts(ctx, sb.ID)
	notFound("code contexts", err)
	_, err = b.CreateCodeContext(ctx, sb.ID, "python", "")
	notFound("code context create", err)
	notFound("delete", b.Delete(ctx, sb.ID))
	resp, err := b.PortClient().Get(b.PortURL(sb.ID, 8080))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !bytes.Contains(body, []byte("not_found")) {
		t.Errorf("tenant b, port proxy to a's sandbox: %d %s", resp.StatusCode, body)
	}
	if list, err := b.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("tenant b lists %v, %v", list, err)
	}
	if list, err := admin.List(ctx, corral.ListOptions{}); err != nil || len(list) != 1 {
		t.Errorf("admin lists %v, %v", list, err)
	}
	if _, err := a.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"}); err != nil {
		t.Errorf("tenant a, exec in its own sandbox: %v", err)
	}

	// Admin routes.
	if _, err := b.Keys(ctx); corral.ErrorCode(err) != corral.CodePermissionDenied {
		t.Errorf("tenant lists keys: %v", err)
	}
	if _, err := b.SetPool(ctx, "p", corral.PoolOptions{Template: "bb", Size: 1}); corral.ErrorCode(err) != corral.CodePermissionDenied {
		t.Errorf("tenant sets a pool: %v", err)
	}

	// Quotas: one sandbox, 256 MiB.
	if _, err := b.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 512}); corral.ErrorCode(err) != corral.CodeResourceExhausted ||
		!strings.Contains(err.Error(), "memory quota is 256 MiB") {
		t.Errorf("over the memory quota: %v", err)
	}
	if _, err := b.Create(ctx, corral.CreateOptions{Template: "bb"}); err != nil {
		t.Fatal(err)
	}
	var e *corral.Error
	if _, err := b.Create(ctx, corral.CreateOptions{Template: "bb"}); corral.ErrorCode(err) != corral.CodeResourceExhausted ||
		!strings.Contains(err.Error(), "sandboxes quota is 1") {
		t.Errorf("over the sandboxes quota: %v", err)
	} else if errors.As(err, &e); e.Status != http.StatusTooManyRequests {
		t.Errorf("quota refusal status %d", e.Status)
	}

	// A revoked key ends its open stream and stops working.
	stream, err := b.Events(ctx, corral.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Next(); err != nil {
				ended <- err
				return
			}
		}
	}()
	if err := admin.DeleteKey(ctx, "team-b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("a revoked key's event stream is still open")
	}
	stream.Close()
	if _, err := b.List(ctx, corral.ListOptions{}); corral.ErrorCode(err) != corral.CodeUnauthenticated {
		t.Errorf("revoked key: %v", err)
	}

	// Rotation: the old secret stops, the new one works.
	k, err := admin.RotateKey(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.List(ctx, corral.ListOptions{}); corral.ErrorCode(err) != corral.CodeUnauthenticated {
		t.Errorf("rotated key: %v", err)
	}
	a2, _ := corral.New(ts.URL, k.Key)
	defer a2.Close()
	if _, err := a2.Get(ctx, sb.ID); err != nil {
		t.Errorf("new secret: %v", err)
	}

	// Bad key input.
	for _, o := range []corral.KeyOptions{{Name: "Bad Name"}, {Name: "x", Tenant: "-no"}, {Name: "admin"}, {Name: "q", MaxCPUs: -1}} {
		if _, err := admin.CreateKey(ctx, o); corral.ErrorCode(err) != corral.CodeInvalidArgument {
			t.Errorf("key %+v: %v", o, err)
		}
	}
	if _, err := admin.CreateKey(ctx, corral.KeyOptions{Name: "team-a"}); corral.ErrorCode(err) != corral.CodeAlreadyExists {
		t.Errorf("a second team-a: %v", err)
	}
}

// BenchmarkExecAudited measures what tenancy and the audit log add to an
// exec round trip over TCP: the same `true` through the bootstrap admin
// key on a server without an audit log (the peer), and through a
// tenant's key on one that records the call and the command (four
// appends). The fake driver runs the command on the host.
func BenchmarkExecAudited(b *testing.B) {
	run := func(b *testing.B, c *corral.Client) {
		sb, err := c.Create(b.Context(), corral.CreateOptions{Template: "bb"})
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res, err := c.Exec(b.Context(), sb.ID, corral.ExecOptions{Shell: "true"}); err != nil || res.ExitCode != 0 {
				b.Fatal(res, err)
			}
		}
	}
	b.Run("admin-unaudited", func(b *testing.B) {
		c, _ := newTestServer(b, "admin-secret")
		run(b, c)
	})
	b.Run("tenant-audited", func(b *testing.B) {
		log, err := audit.Open(b.TempDir(), audit.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer log.Close()
		admin, ts := newTestServer(b, "admin-secret", func(cfg *sandbox.Config) { cfg.Audit = log })
		k, err := admin.CreateKey(b.Context(), corral.KeyOptions{Name: "t", MaxSandboxes: 10})
		if err != nil {
			b.Fatal(err)
		}
		c, _ := corral.New(ts.URL, k.Key)
		defer c.Close()
		run(b, c)
	})
}

// TestTenantClaimsFromPool checks that a tenant's create takes a ready
// member of the shared warm pool, which then belongs to the tenant.
func TestTenantClaimsFromPool(t *testing.T) {
	admin, ts := newTestServer(t, "admin-secret")
	ctx := t.Context()
	if _, err := admin.SetPool(ctx, "warm", corral.PoolOptions{Template: "bb", Size: 1}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p, err := admin.GetPool(ctx, "warm")
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", p)
		}
	}
	a, _ := newTenant(t, admin, ts.URL, "team-a")
	sb, err := a.Create(ctx, corral.CreateOptions{Pool: "warm"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Tenant != "team-a" {
		t.Fatalf("claimed sandbox's tenant %q", sb.Tenant)
	}
	m, err := admin.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(m, []byte("corral_pool_hits_total 1\n")) {
		t.Fatalf("the tenant's create was no pool hit:\n%s", grepLines(m, "corral_pool_"))
	}
}

func grepLines(b []byte, sub string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestQuotaCountsWhatASandboxIsGiven checks that a tenant's memory quota
// counts the memory a sandbox gets, not what its call asked for: a PATCH
// that grows a running sandbox, a create from a snapshot (the snapshot's
// limits), a create from a named pool (the pool's), and the start of a
// stopped sandbox (which held none while stopped).
func TestQuotaCountsWhatASandboxIsGiven(t *testing.T) {
	tests := []struct {
		name string
		call func(ctx context.Context, a *corral.Client, sb *corral.Sandbox) error
	}{
		{"start a stopped sandbox", func(ctx context.Context, a *corral.Client, sb *corral.Sandbox) error {
			if _, err := a.Stop(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 384}); err != nil {
				t.Fatalf("a create while the other is stopped: %v", err)
			}
			_, err := a.Start(ctx, sb.ID, nil)
			return err
		}},
		{"grow a running sandbox", func(ctx context.Context, a *corral.Client, sb *corral.Sandbox) error {
			_, err := a.Update(ctx, sb.ID, corral.UpdateOptions{MemoryMB: 640})
			return err
		}},
		{"create from a snapshot", func(ctx context.Context, a *corral.Client, sb *corral.Sandbox) error {
			if _, err := a.CreateSnapshot(ctx, sb.ID, "s", nil); err != nil {
				t.Fatal(err)
			}
			_, err := a.Create(ctx, corral.CreateOptions{FromSnapshot: "s"})
			return err
		}},
		{"create from a named pool", func(ctx context.Context, a *corral.Client, _ *corral.Sandbox) error {
			_, err := a.Create(ctx, corral.CreateOptions{Pool: "big"})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			admin, ts := newTestServer(t, "admin-secret")
			ctx := t.Context()
			if _, err := admin.SetPool(ctx, "big", corral.PoolOptions{Template: "bb", MemoryMB: 384, Size: 1}); err != nil {
				t.Fatal(err)
			}
			k, err := admin.CreateKey(ctx, corral.KeyOptions{Name: "team-a", MaxMemoryMB: 512})
			if err != nil {
				t.Fatal(err)
			}
			a, _ := corral.New(ts.URL, k.Key)
			defer a.Close()
			// 384 MiB of 512; the default is 128 MiB, which would fit.
			sb, err := a.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 384})
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.call(ctx, a, sb); corral.ErrorCode(err) != corral.CodeResourceExhausted || !strings.Contains(err.Error(), "memory quota is 512 MiB") {
				t.Fatalf("past the memory quota: %v", err)
			}
			if got, err := a.Get(ctx, sb.ID); err != nil || got.MemoryMB != 384 {
				t.Fatalf("after the refusal: %+v, %v", got, err)
			}
		})
	}
}

// newAuditedTenant serves the API with an audit log and returns the
// admin's client, a client of a new tenant's key named name, that key,
// and the log.
func newAuditedTenant(t *testing.T, name string) (admin, c *corral.Client, k *corral.Key, log *audit.Log) {
	t.Helper()
	log, err := audit.Open(t.TempDir(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	admin, ts := newTestServer(t, "admin-secret", func(cfg *sandbox.Config) { cfg.Audit = log })
	c, k = newTenant(t, admin, ts.URL, name)
	return admin, c, k, log
}

// newTenant makes a key of a new tenant named name with admin's client
// and returns a client of that key, closed when the test ends, and the
// key.
func newTenant(t testing.TB, admin *corral.Client, url, name string) (*corral.Client, *corral.Key) {
	t.Helper()
	k, err := admin.CreateKey(t.Context(), corral.KeyOptions{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	c, err := corral.New(url, k.Key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, k
}

// TestAuditRecordsCommands checks that every way of starting a command
// leaves a record with the caller's key before it runs and one with its
// exit after: exec, the command of POST /v1/run (sent to the agent while
// the sandbox starts), and a background process.
func TestAuditRecordsCommands(t *testing.T) {
	admin, c, k, _ := newAuditedTenant(t, "runner")
	ctx := t.Context()

	sb, res, err := c.Run(ctx, corral.RunOptions{Sandbox: corral.CreateOptions{Template: "bb"}, Exec: corral.ExecOptions{Cmd: []string{"echo", "from-run"}}})
	if err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	if _, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"echo", "from-exec"}}); err != nil {
		t.Fatal(err)
	}
	p, err := c.StartProcess(ctx, sb.ID, corral.StartOptions{Cmd: []string{"echo", "from-process"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, sb.ID, p.PID); err != nil {
		t.Fatal(err)
	}

	// The exit of a background process is recorded by a waiter of its
	// own, which may still be writing when Wait returns here.
	var starts map[string]string
	var ends map[string]bool
	for deadline := time.Now().Add(5 * time.Second); ; {
		starts, ends = map[string]string{}, map[string]bool{}
		err = admin.Audit(ctx, corral.AuditOptions{SandboxID: sb.ID}, func(r corral.AuditRecord) error {
			if r.Key != "runner" || r.Tenant != k.Tenant {
				t.Errorf("record of %q by key %q tenant %q", r.Action, r.Key, r.Tenant)
			}
			switch {
			case len(r.Argv) == 2:
				starts[r.Argv[1]] = r.Action
			case r.ExitCode != nil:
				ends[r.Action] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if ends["process"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for arg, action := range map[string]string{"from-run": "exec", "from-exec": "exec", "from-process": "process"} {
		if starts[arg] != action {
			t.Errorf("no %s record of echo %s: %v", action, arg, starts)
		}
	}
	if !ends["exec"] || !ends["process"] {
		t.Errorf("exit records: %v", ends)
	}
}

// TestAuditRecordsProcessInput checks that what a client does to a
// running process is on record under its key, before and after: stdin
// writes and close, signals, terminal resizes, and attach sessions, which
// may do all of these.
func TestAuditRecordsProcessInput(t *testing.T) {
	_, c, _, log := newAuditedTenant(t, "typist")
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.StartProcess(ctx, sb.ID, corral.StartOptions{Cmd: []string{"cat"}, PTY: &corral.PTYSize{Cols: 80, Rows: 24}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendStdin(ctx, sb.ID, p.PID, strings.NewReader("hello\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, sb.ID, p.PID, corral.PTYSize{Cols: 100, Rows: 30}); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, sb.ID, p.PID); err != nil {
		t.Fatal(err)
	}
	q, err := c.StartProcess(ctx, sb.ID, corral.StartOptions{Cmd: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Attach(ctx, sb.ID, q.PID, corral.AttachOptions{})
		done <- err
	}()
	// The attach session is on record before it starts; the signal then
	// ends the process, and with it the session.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		_ = log.Query(ctx, audit.Filter{SandboxID: sb.ID}, func(r audit.Record) error {
			if strings.HasSuffix(r.Action, "/attach") {
				n++
			}
			return nil
		})
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no record of the attach session")
		}
	}
	if err := c.Signal(ctx, sb.ID, q.PID, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The attach session's end is recorded once its handler returns,
	// which may be after the client saw the exit.
	actions := []string{
		"POST /v1/sandboxes/{id}/processes/{pid}/stdin",
		"DELETE /v1/sandboxes/{id}/processes/{pid}/stdin",
		"POST /v1/sandboxes/{id}/processes/{pid}/resize",
		"POST /v1/sandboxes/{id}/processes/{pid}/signal",
		"GET /v1/sandboxes/{id}/processes/{pid}/attach",
	}
	// got[action] has bit 1 for a record before the call, 2 for one
	// with its status after.
	var got map[string]int
	complete := func() bool {
		for _, action := range actions {
			if got[action] != 3 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); !complete() && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = map[string]int{}
		err := log.Query(ctx, audit.Filter{SandboxID: sb.ID, Key: "typist"}, func(r audit.Record) error {
			if strings.Contains(r.Action, "/processes/{pid}/") && r.Detail["pid"] != "" {
				got[r.Action] |= map[bool]int{true: 1, false: 2}[r.Status == 0]
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, action := range actions {
		if got[action] != 3 {
			t.Errorf("%s on record before and after: %b, want 11", action, got[action])
		}
	}
}

// TestMetricsFollowTenants checks that per-sandbox series name their
// tenant, that an admin's scrape shows every tenant's, and that a
// tenant's shows its own sandboxes only and none of the host's families.
func TestMetricsFollowTenants(t *testing.T) {
	admin, ts := newTestServer(t, "admin-secret")
	ctx := t.Context()
	a, _ := newTenant(t, admin, ts.URL, "team-a")
	b, _ := newTenant(t, admin, ts.URL, "team-b")
	ids := map[string]string{}
	for tenant, c := range map[string]*corral.Client{"team-a": a, "team-b": b, "": admin} {
		sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
		if err != nil {
			t.Fatal(err)
		}
		ids[tenant] = sb.ID
	}
	scrape := func(c *corral.Client) (*metrics.Scrape, []byte) {
		t.Helper()
		text, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s, err := metrics.Parse(bytes.NewReader(text))
		if err != nil {
			t.Fatalf("%v\n%s", err, text)
		}
		return s, text
	}
	all, text := scrape(admin)
	for tenant, id := range ids {
		for _, name := range []string{"corral_sandbox_memory_bytes", "corral_sandbox_cpu_seconds_total"} {
			if _, ok := all.Get(name, "sandbox_id", id, "tenant", tenant); !ok {
				t.Errorf("admin's scrape: no %s of %s with tenant %q in\n%s", name, id, tenant, text)
			}
		}
	}
	if v, _ := all.Get("corral_sandboxes", "state", "running"); v != 3 {
		t.Errorf("admin's scrape: %v running sandboxes, want 3", v)
	}

	own, text := scrape(a)
	for _, name := range []string{"corral_sandbox_memory_bytes", "corral_sandbox_cpu_seconds_total"} {
		got := own.Find(name)
		if len(got) != 1 || got[0].Labels["sandbox_id"] != ids["team-a"] || got[0].Labels["tenant"] != "team-a" {
			t.Errorf("team-a's scrape: %s samples %+v, want team-a's sandbox only", name, got)
		}
	}
	if v, _ := own.Get("corral_sandboxes", "state", "running"); v != 1 {
		t.Errorf("team-a's scrape: %v running sandboxes, want its 1", v)
	}
	want := map[string]string{"corral_sandboxes": "gauge", "corral_sandbox_memory_bytes": "gauge", "corral_sandbox_cpu_seconds_total": "counter"}
	if diff := cmp.Diff(want, own.Types); diff != "" {
		t.Errorf("families of team-a's scrape (-want +got):\n%s\n%s", diff, text)
	}
}

// TestTenantTemplates checks who sees and changes templates: a tenant
// makes its own, which another tenant cannot see, use, delete or take
// the name of; the operator's are everyone's to use and the admins' to
// change; pools, which every tenant shares, hold no tenant's template.
func TestTenantTemplates(t *testing.T) {
	admin, ts := newTestServer(t, "admin-secret")
	ctx := t.Context()
	a, _ := newTenant(t, admin, ts.URL, "team-a")
	b, _ := newTenant(t, admin, ts.URL, "team-b")

	own, err := a.ImportTemplate(ctx, "a-tpl", emptyTar())
	if err != nil {
		t.Fatalf("a tenant makes a template: %v", err)
	}
	if own.Tenant != "team-a" {
		t.Fatalf("tenant of a's template %q", own.Tenant)
	}
	names := func(c *corral.Client) []string {
		t.Helper()
		ts, err := c.Templates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tpl := range ts {
			out = append(out, tpl.Name+"/"+tpl.Tenant)
		}
		return out
	}
	for _, tt := range []struct {
		name string
		c    *corral.Client
		want []string
	}{
		{"team-a", a, []string{"a-tpl/team-a", "bb/"}},
		{"team-b", b, []string{"bb/"}},
		{"admin", admin, []string{"a-tpl/team-a", "bb/"}},
	} {
		if diff := cmp.Diff(tt.want, names(tt.c)); diff != "" {
			t.Errorf("templates %s lists (-want +got):\n%s", tt.name, diff)
		}
	}

	notFound := func(what string, err error) {
		t.Helper()
		if corral.ErrorCode(err) != corral.CodeNotFound {
			t.Errorf("team-b, %s of a's template: %v, want not_found", what, err)
		}
	}
	_, err = b.Template(ctx, "a-tpl")
	notFound("get", err)
	_, err = b.Create(ctx, corral.CreateOptions{Template: "a-tpl"})
	notFound("create from", err)
	notFound("delete", b.DeleteTemplate(ctx, "a-tpl"))
	_, err = b.SetTemplateService(ctx, "a-tpl", nil)
	notFound("set service", err)
	_, err = b.ImportTemplate(ctx, "a-tpl", emptyTar())
	if corral.ErrorCode(err) != corral.CodeAlreadyExists || strings.Contains(err.Error(), "team-a") {
		t.Errorf("team-b takes a's template name: %v, want already_exists not naming the owner", err)
	}

	denied := func(what string, err error) {
		t.Helper()
		if corral.ErrorCode(err) != corral.CodePermissionDenied {
			t.Errorf("team-a, %s of the operator's template: %v, want permission_denied", what, err)
		}
	}
	denied("delete", a.DeleteTemplate(ctx, "bb"))
	_, err = a.SetTemplateService(ctx, "bb", nil)
	denied("set service", err)
	if _, err := a.Template(ctx, "bb"); err != nil {
		t.Errorf("team-a gets the operator's template: %v", err)
	}

	sb, err := a.Create(ctx, corral.CreateOptions{Template: "a-tpl"})
	if err != nil {
		t.Fatalf("team-a creates from its template: %v", err)
	}
	if _, err := admin.SetPool(ctx, "warm-a", corral.PoolOptions{Template: "a-tpl", Size: 1}); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Errorf("a pool of a tenant's template: %v, want failed_precondition", err)
	}
	if _, err := admin.Template(ctx, "a-tpl"); err != nil {
		t.Errorf("admin gets a's template: %v", err)
	}
	other, err := admin.Create(ctx, corral.CreateOptions{Template: "a-tpl"})
	if err != nil {
		t.Fatal(err)
	}
	// The refusal names team-a's sandbox, not the operator's.
	if err := a.DeleteTemplate(ctx, "a-tpl"); corral.ErrorCode(err) != corral.CodeFailedPrecondition ||
		!strings.Contains(err.Error(), sb.ID+", 1 of other tenants") || strings.Contains(err.Error(), other.ID) {
		t.Errorf("delete of a template in use: %v", err)
	}
	for _, id := range []string{sb.ID, other.ID} {
		if err := admin.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.DeleteTemplate(ctx, "a-tpl"); err != nil {
		t.Errorf("team-a deletes its template: %v", err)
	}
}
