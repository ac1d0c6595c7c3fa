// Package secretstest is the conformance suite every secrets.Records runs
// from its own tests: a put inserts or replaces by tenant and name, the
// same name in two tenants is two records, a delete is idempotent, a
// listing holds one tenant's records by name, and records read back share
// no bytes with the caller.
package secretstest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/secrets"
)

// Run runs the suite on the empty records that newRecords returns.
func Run(t *testing.T, newRecords func(t *testing.T) secrets.Records) {
	ctx := t.Context()
	recs := newRecords(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := secrets.Record{Tenant: "a", Name: "openai", Ciphertext: []byte{1, 2, 3}, CreatedAt: at, UpdatedAt: at}
	b := secrets.Record{Tenant: "b", Name: "openai", Ciphertext: []byte{4}, CreatedAt: at, UpdatedAt: at}
	op := secrets.Record{Tenant: "", Name: "github", Ciphertext: []byte{5}, CreatedAt: at, UpdatedAt: at}
	a2 := secrets.Record{Tenant: "a", Name: "github", Ciphertext: []byte{6}, CreatedAt: at, UpdatedAt: at}
	for _, r := range []secrets.Record{a, b, op, a2} {
		if err := recs.PutSecret(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a.Ciphertext, a.UpdatedAt = []byte{7, 8}, at.Add(time.Hour)
	if err := recs.PutSecret(ctx, a); err != nil {
		t.Fatal(err)
	}
	a.Ciphertext[0] = 9 // the stored record must not change with it
	got, ok, err := recs.Secret(ctx, "a", "openai")
	a.Ciphertext[0] = 7
	if err != nil || !ok {
		t.Fatalf("secret a/openai: %v %v", ok, err)
	}
	if diff := cmp.Diff(a, got); diff != "" {
		t.Errorf("a/openai after a replace (-want +got):\n%s", diff)
	}
	got.Ciphertext[0] = 0
	if again, _, _ := recs.Secret(ctx, "a", "openai"); again.Ciphertext[0] != 7 {
		t.Error("a record read back shares its ciphertext with the store")
	}
	if _, ok, err := recs.Secret(ctx, "c", "openai"); ok || err != nil {
		t.Errorf("secret of another tenant: %v %v", ok, err)
	}
	for tenant, want := range map[string][]secrets.Record{"a": {a2, a}, "b": {b}, "": {op}, "c": nil} {
		list, err := recs.Secrets(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, list); diff != "" {
			t.Errorf("secrets of tenant %q (-want +got):\n%s", tenant, diff)
		}
	}
	if err := recs.DeleteSecret(ctx, "a", "openai"); err != nil {
		t.Fatal(err)
	}
	if err := recs.DeleteSecret(ctx, "a", "openai"); err != nil {
		t.Errorf("deleting a missing record: %v", err)
	}
	if _, ok, _ := recs.Secret(ctx, "a", "openai"); ok {
		t.Error("a deleted record is still there")
	}
	if _, ok, _ := recs.Secret(ctx, "b", "openai"); !ok {
		t.Error("deleting a's openai deleted b's")
	}
}
