package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestTenants runs two tenants and an admin against a live daemon over TCP
// and its E2B facade: tenant B cannot list, get, exec, attach, read files
// of, proxy to, snapshot, fork or delete tenant A's sandbox; B's quota
// refuses with 429; a key revoked during an attach ends the attach.
func TestTenants(t *testing.T) {
	addr, e2bAddr := testutil.FreeLoopbackAddr(t), testutil.FreeLoopbackAddr(t)
	d := startDaemon(t, "overlay", "--listen", addr, "--api-key", "admin-secret", "--e2b-listen", e2bAddr)
	ctx := t.Context()
	admin, err := corral.New("http://"+addr, "admin-secret")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	keys := map[string]string{}
	client := func(name string, quota int) *corral.Client {
		k, err := admin.CreateKey(ctx, corral.KeyOptions{Name: name, MaxSandboxes: quota})
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = k.Key
		c, err := corral.New("http://"+addr, k.Key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	a, b := client("team-a", 0), client("team-b", 2)

	sb, err := a.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.StartProcess(ctx, sb.ID, corral.StartOptions{Shell: "echo hello; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	denied := map[string]error{}
	_, denied["get"] = b.Get(ctx, sb.ID)
	_, denied["exec"] = b.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true"})
	_, denied["attach"] = b.Attach(ctx, sb.ID, p.PID, corral.AttachOptions{})
	_, denied["read file"] = b.ReadFile(ctx, sb.ID, "/etc/hostname")
	_, denied["snapshot"] = b.CreateSnapshot(ctx, sb.ID, "stolen", nil)
	_, denied["fork"] = b.Fork(ctx, sb.ID, 1)
	denied["delete"] = b.Delete(ctx, sb.ID)
	for what, err := range denied {
		if corral.ErrorCode(err) != corral.CodeNotFound {
			t.Errorf("tenant b, %s of a's sandbox: %v, want not_found", what, err)
		}
	}
	resp, err := b.PortClient().Get(b.PortURL(sb.ID, 80))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("tenant b, port proxy to a's sandbox: %d", resp.StatusCode)
	}
	if list, err := b.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("tenant b lists %+v, %v", list, err)
	}
	if out, _ := d.execOut(t, sb.ID, "echo still-here"); out != "still-here\n" {
		t.Errorf("a's sandbox after b's attempts: %q", out)
	}
	if res, err := a.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "echo audited; exit 3"}); err != nil || res.ExitCode != 3 {
		t.Fatalf("tenant a's exec: %+v %v", res, err)
	}
	checkAudit(t, "http://"+addr, "admin-secret", sb.ID)

	// The E2B facade: a key is a team.
	e2b := func(key, path string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e2bAddr+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := e2b(keys["team-b"], "/sandboxes/"+sb.ID); code != http.StatusNotFound {
		t.Errorf("E2B, tenant b gets a's sandbox: %d %s", code, body)
	}
	if code, body := e2b(keys["team-b"], "/v2/sandboxes"); code != http.StatusOK || strings.Contains(body, sb.ID) {
		t.Errorf("E2B, tenant b lists: %d %s", code, body)
	}
	if code, body := e2b(keys["team-a"], "/sandboxes/"+sb.ID); code != http.StatusOK {
		t.Errorf("E2B, tenant a gets its sandbox: %d %s", code, body)
	}

	// Quota: two sandboxes for b.
	var mine []string
	for range 2 {
		s, err := b.Create(ctx, corral.CreateOptions{Template: "bb"})
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, s.ID)
	}
	_, err = b.Create(ctx, corral.CreateOptions{Template: "bb"})
	var e *corral.Error
	if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || e.Code != corral.CodeResourceExhausted {
		t.Errorf("over b's quota: %v", err)
	}

	// Revocation ends an open attach.
	bp, err := b.StartProcess(ctx, mine[0], corral.StartOptions{Shell: "while true; do echo tick; sleep 0.2; done"})
	if err != nil {
		t.Fatal(err)
	}
	attached := make(chan error, 1)
	var out testutil.SyncBuffer
	go func() {
		_, err := b.Attach(context.Background(), mine[0], bp.PID, corral.AttachOptions{Stdout: &out})
		attached <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if err := admin.DeleteKey(ctx, "team-b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-attached:
	case <-time.After(10 * time.Second):
		t.Fatal("an attach of a revoked key is still open")
	}
	if _, err := b.List(ctx, corral.ListOptions{}); corral.ErrorCode(err) != corral.CodeUnauthenticated {
		t.Errorf("revoked key: %v", err)
	}
	// The admin still sees and cleans up everything.
	all, err := admin.List(ctx, corral.ListOptions{})
	if err != nil || len(all) != 3 {
		b, _ := json.Marshal(all)
		t.Errorf("admin lists %s, %v", b, err)
	}
}

// checkAudit reads the audit log of sandbox id (GET /v1/audit) and checks
// that it holds tenant a's exec, before it ran and with its exit status,
// a's background process, and b's refused attempts with their status.
func checkAudit(t *testing.T, base, adminKey, id string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", base+"/v1/audit?sandbox="+id, nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type record struct {
		Key      string   `json:"key"`
		Tenant   string   `json:"tenant"`
		Action   string   `json:"action"`
		Status   int      `json:"status"`
		Argv     []string `json:"argv"`
		ExitCode *int     `json:"exit_code"`
	}
	var got []record
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var r record
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	has := func(what string, f func(record) bool) {
		t.Helper()
		for _, r := range got {
			if f(r) {
				return
			}
		}
		b, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("the audit log of %s has no %s:\n%s", id, what, b)
	}
	has("exec by team-a before it ran", func(r record) bool {
		return r.Action == "exec" && r.Key == "team-a" && r.Tenant == "team-a" && strings.Join(r.Argv, " ") == "/bin/sh -c echo audited; exit 3"
	})
	has("exec by team-a with its exit status", func(r record) bool {
		return r.Action == "exec" && r.Key == "team-a" && r.ExitCode != nil && *r.ExitCode == 3
	})
	has("team-a's background process", func(r record) bool { return r.Action == "process" && r.Key == "team-a" })
	has("team-b's refused exec", func(r record) bool {
		return r.Action == "POST /v1/sandboxes/{id}/exec" && r.Key == "team-b" && r.Status == http.StatusNotFound
	})
	has("the unix socket's exec", func(r record) bool { return r.Action == "exec" && r.Key == "unix" })
}
