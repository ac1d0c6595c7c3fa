package server

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

// TestSecretsPerTenant drives /v1/secrets with two tenants' keys and an
// admin key: each tenant sees and changes only its own secrets, the same
// name in two tenants is two secrets, an admin acts for a tenant with
// X-Corral-Tenant, and no answer or audit record holds a value.
func TestSecretsPerTenant(t *testing.T) {
	auditDir := t.TempDir()
	log, err := audit.Open(auditDir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	admin, ts := newTestServer(t, "admin-secret", func(cfg *sandbox.Config) { cfg.Audit = log })
	ctx := t.Context()
	client := func(name string) (*corral.Client, string) {
		t.Helper()
		k, err := admin.CreateKey(ctx, corral.KeyOptions{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		c, err := corral.New(ts.URL, k.Key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c, k.Key
	}
	a, aKey := client("team-a")
	b, _ := client("team-b")
	const valueA, valueB, rotated = "sk-value-of-team-a", "sk-value-of-team-b", "sk-rotated-value"

	s, err := a.CreateSecret(ctx, "openai", valueA)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "openai" || s.CreatedAt.IsZero() {
		t.Fatalf("created %+v", s)
	}
	if _, err := b.CreateSecret(ctx, "openai", valueB); err != nil {
		t.Fatalf("the same name in another tenant: %v", err)
	}
	if _, err := a.CreateSecret(ctx, "openai", "again"); corral.ErrorCode(err) != corral.CodeAlreadyExists {
		t.Errorf("a second openai in team-a: %v", err)
	}
	if _, err := b.CreateSecret(ctx, "github", valueB); err != nil {
		t.Fatal(err)
	}
	names := func(c *corral.Client) string {
		t.Helper()
		list, err := c.Secrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list {
			out = append(out, s.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names(a); got != "openai" {
		t.Errorf("team-a lists %q", got)
	}
	if got := names(b); got != "github,openai" {
		t.Errorf("team-b lists %q", got)
	}
	if got := names(admin); got != "" {
		t.Errorf("the admin, for itself, lists %q", got)
	}
	if err := a.DeleteSecret(ctx, "github"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Errorf("team-a deletes team-b's github: %v", err)
	}
	if _, err := a.RotateSecret(ctx, "github", "x"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Errorf("team-a rotates team-b's github: %v", err)
	}
	if _, err := a.RotateSecret(ctx, "openai", rotated); err != nil {
		t.Fatal(err)
	}

	// An admin acts for team-b with X-Corral-Tenant.
	do := func(method, path, key, tenant, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, ts.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		if tenant != "" {
			req.Header.Set(TenantHeader, tenant)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		return resp.StatusCode, buf.String()
	}
	if code, body := do("GET", "/v1/secrets", "admin-secret", "team-b", ""); code != 200 || !strings.Contains(body, `"github"`) || strings.Contains(body, valueB) {
		t.Errorf("admin for team-b lists: %d %s", code, body)
	}
	if code, body := do("DELETE", "/v1/secrets/github", "admin-secret", "team-b", ""); code != http.StatusNoContent {
		t.Errorf("admin for team-b deletes github: %d %s", code, body)
	}
	if got := names(b); got != "openai" {
		t.Errorf("team-b lists %q after the admin's delete", got)
	}
	if code, body := do("GET", "/v1/secrets", aKey, "team-b", ""); code != http.StatusForbidden {
		t.Errorf("team-a sends %s: %d %s", TenantHeader, code, body)
	}

	// Refusals.
	for _, tt := range []struct {
		name, method, path, key, body string
		status                        int
	}{
		{"no key", "GET", "/v1/secrets", "", "", http.StatusUnauthorized},
		{"wrong key", "POST", "/v1/secrets", "crl_wrong", `{"name":"x","value":"` + valueA + `"}`, http.StatusUnauthorized},
		{"bad name", "POST", "/v1/secrets", aKey, `{"name":"Bad Name","value":"` + valueA + `"}`, http.StatusBadRequest},
		{"empty value", "POST", "/v1/secrets", aKey, `{"name":"empty","value":""}`, http.StatusBadRequest},
		{"no value", "POST", "/v1/secrets", aKey, `{"name":"empty"}`, http.StatusBadRequest},
		{"huge value", "POST", "/v1/secrets", aKey, `{"name":"huge","value":"` + strings.Repeat("v", 64<<10+1) + `"}`, http.StatusBadRequest},
		{"malformed body", "POST", "/v1/secrets", aKey, `{"name":"x","value":` + valueA + `}`, http.StatusBadRequest},
		{"unknown field", "POST", "/v1/secrets", aKey, `{"name":"x","value":"v","tenant":"team-b"}`, http.StatusBadRequest},
		{"rename in a rotate", "PUT", "/v1/secrets/openai", aKey, `{"name":"other","value":"` + valueA + `"}`, http.StatusBadRequest},
		{"rotate missing", "PUT", "/v1/secrets/missing", aKey, `{"value":"` + valueA + `"}`, http.StatusNotFound},
		{"delete missing", "DELETE", "/v1/secrets/missing", aKey, "", http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(tt.method, tt.path, tt.key, "", tt.body)
			if code != tt.status {
				t.Errorf("%d %s, want %d", code, body, tt.status)
			}
			if strings.Contains(body, valueA) || strings.Contains(body, "vvvvvvvv") {
				t.Errorf("the answer shows the value: %s", body)
			}
		})
	}

	// No value in any answer, and none in the audit log, which records
	// the calls.
	if _, body := do("GET", "/v1/secrets", aKey, "", ""); strings.Contains(body, valueA) || strings.Contains(body, rotated) {
		t.Errorf("the listing shows a value: %s", body)
	}
	files, err := filepath.Glob(filepath.Join(auditDir, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("audit files %v %v", files, err)
	}
	var recorded bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		recorded.Write(b)
	}
	for _, v := range []string{valueA, valueB, rotated} {
		if bytes.Contains(recorded.Bytes(), []byte(v)) {
			t.Errorf("the audit log holds a value")
		}
	}
	for _, action := range []string{`"POST /v1/secrets"`, `"PUT /v1/secrets/{name}"`, `"DELETE /v1/secrets/{name}"`} {
		if !bytes.Contains(recorded.Bytes(), []byte(action)) {
			t.Errorf("the audit log has no %s", action)
		}
	}
}

func TestSecretsWithoutStore(t *testing.T) {
	if _, err := (&Server{}).secretStore(); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("a server without a secret store: %v", err)
	}
}
