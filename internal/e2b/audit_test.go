package e2b

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// openAuditLog opens an audit log that the test's end closes.
func openAuditLog(t *testing.T) *audit.Log {
	t.Helper()
	log, err := audit.Open(t.TempDir(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	return log
}

// TestControlCallsAudited checks that the facade's control-plane calls
// that change something are on record under the caller's key before they
// run and with their outcome after, that reads are not, and that a log
// that cannot be written refuses them with nothing changed.
func TestControlCallsAudited(t *testing.T) {
	log := openAuditLog(t)
	e := newEnv(t, func(_ *sandbox.Config, c *Config) { c.Audit = log })
	calls := []struct{ method, path, pattern, body string }{
		{"POST", "/sandboxes/" + e.id + "/timeout", "POST /sandboxes/{id}/timeout", `{"timeout":60}`},
		{"GET", "/sandboxes/" + e.id, "GET /sandboxes/{id}", ""},
		{"POST", "/sandboxes/" + e.id + "/pause", "POST /sandboxes/{id}/pause", ""},
		{"POST", "/sandboxes/" + e.id + "/connect", "POST /sandboxes/{id}/connect", `{"timeout":60}`},
		{"DELETE", "/templates/nope", "DELETE /templates/{id}", ""},
		{"DELETE", "/sandboxes/" + e.id, "DELETE /sandboxes/{id}", ""},
	}
	status := map[string]int{}
	for _, c := range calls {
		status[c.pattern] = e.api(c.method, c.path, c.body, nil)
	}

	type seen struct {
		before bool
		status int
	}
	got := map[string]*seen{}
	err := log.Query(t.Context(), audit.Filter{}, func(r audit.Record) error {
		if r.Key != tenancy.BootstrapName {
			t.Errorf("record of %s by key %q, want %q", r.Action, r.Key, tenancy.BootstrapName)
		}
		s := got[r.Action]
		if s == nil {
			s = &seen{}
			got[r.Action] = s
		}
		if r.Status == 0 {
			s.before = s.status == 0 // before its outcome
		} else {
			s.status = r.Status
		}
		switch {
		case r.Action == "DELETE /templates/{id}" && (r.SandboxID != "" || r.Detail["id"] != "nope"):
			t.Errorf("template delete on record as sandbox %q, detail %v", r.SandboxID, r.Detail)
		case r.Action != "DELETE /templates/{id}" && r.Action != "POST /v2/sandboxes" && r.SandboxID != e.id:
			t.Errorf("%s on record for sandbox %q, want %s", r.Action, r.SandboxID, e.id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := got["POST /v2/sandboxes"]; s == nil || !s.before || s.status != http.StatusCreated {
		t.Errorf("the create of newEnv on record: %+v", s)
	}
	for _, c := range calls {
		s := got[c.pattern]
		if c.method == "GET" {
			if s != nil {
				t.Errorf("a read on record: %s", c.pattern)
			}
			continue
		}
		if s == nil || !s.before || s.status != status[c.pattern] {
			t.Errorf("%s answered %d; on record: %+v", c.pattern, status[c.pattern], s)
		}
	}

	// A log that cannot be written refuses the call.
	log.Close()
	before := len(e.m.List(t.Context(), sandbox.Filter{}))
	var out map[string]any
	if code := e.api("POST", "/v2/sandboxes", `{"templateID":"bb"}`, &out); code != http.StatusBadGateway {
		t.Errorf("create with the audit log closed: %d %v", code, out)
	}
	if n := len(e.m.List(t.Context(), sandbox.Filter{})); n != before {
		t.Errorf("an unaudited create made a sandbox: %d sandboxes, had %d", n, before)
	}
}

// TestEnvdCommandsAuditedUnderCreator checks that a command started
// through envd is on record under the sandbox's tenant and the key that
// created it: with the sandbox's access token as with that key itself.
func TestEnvdCommandsAuditedUnderCreator(t *testing.T) {
	log := openAuditLog(t)
	e, _, k, secret := newTenantEnv(t, func(m *sandbox.Config, _ *Config) { m.Audit = log })
	e.createAs(secret)

	start := func(word string, hdr map[string]string) {
		t.Helper()
		body := `{"process":{"cmd":"/bin/sh","args":["-c","echo ` + word + `"]},"stdin":false}`
		if _, end := e.streamJSON("process.Process/Start", body, hdr); end["error"] != nil {
			t.Fatalf("start %s: %v", word, end)
		}
	}
	start("by-token", nil)
	e.token = ""
	start("by-key", map[string]string{"X-API-Key": secret})

	got := map[string]audit.Record{}
	err := log.Query(t.Context(), audit.Filter{SandboxID: e.id}, func(r audit.Record) error {
		if len(r.Argv) == 3 {
			got[r.Argv[2]] = r
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, word := range []string{"by-token", "by-key"} {
		r, ok := got["echo "+word]
		if !ok || r.Action != "process" || r.Key != "team-a" || r.Tenant != k.Tenant {
			t.Errorf("command started %s on record as %+v (found %v), want key team-a, tenant %s", word, r, ok, k.Tenant)
		}
	}
}

// TestEnvdChangesAudited checks that envd calls that change a sandbox's
// files or processes are on record, before and after, under the key that
// created the sandbox, and that reads are not.
func TestEnvdChangesAudited(t *testing.T) {
	log := openAuditLog(t)
	e := newEnv(t, func(_ *sandbox.Config, c *Config) { c.Audit = log })
	if code, out := e.unary("filesystem.Filesystem/MakeDir", `{"path":"/work/d"}`); code != 200 {
		t.Fatalf("makeDir: %d %v", code, out)
	}
	if code, out := e.unary("filesystem.Filesystem/Stat", `{"path":"/work/d"}`); code != 200 {
		t.Fatalf("stat: %d %v", code, out)
	}
	if resp := e.envd("POST", "/files?path=/work/d/f.txt", "application/octet-stream", strings.NewReader("x"), nil); resp.StatusCode != 200 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	if code, out := e.unary("filesystem.Filesystem/Remove", `{"path":"/work/d"}`); code != 200 {
		t.Fatalf("remove: %d %v", code, out)
	}
	got := map[string][]int{} // action -> statuses on record, 0 before the call
	err := log.Query(t.Context(), audit.Filter{SandboxID: e.id}, func(r audit.Record) error {
		if r.Key != tenancy.BootstrapName {
			t.Errorf("record of %s by key %q", r.Action, r.Key)
		}
		got[r.Action] = append(got[r.Action], r.Status)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int{
		"POST /filesystem.Filesystem/MakeDir": {0, 200},
		"POST /files":                         {0, 200},
		"POST /filesystem.Filesystem/Remove":  {0, 200},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("envd calls on record (-want +got):\n%s", diff)
	}
}
