package e2b

import (
	"context"
	"testing"
)

// Snapshots and forks through E2B's API: a named snapshot is listed,
// starts a sandbox when named as the template, and is deleted through
// DELETE /templates/{id}; a fork answers one sandbox per copy.
func TestSnapshotsAndFork(t *testing.T) {
	e := newEnv(t)
	var snap map[string]any
	if code := e.api("POST", "/sandboxes/"+e.id+"/snapshots", `{"name":"e2b-snap"}`, &snap); code != 201 || snap["snapshotID"] != "e2b-snap" {
		t.Fatalf("create snapshot: %d %v", code, snap)
	}
	var list []map[string]any
	if code := e.api("GET", "/snapshots?sandboxID="+e.id, "", &list); code != 200 || len(list) != 1 || list[0]["snapshotID"] != "e2b-snap" {
		t.Fatalf("list snapshots: %d %v", code, list)
	}
	list = nil
	if code := e.api("GET", "/snapshots?sandboxID=other", "", &list); code != 200 || len(list) != 0 {
		t.Fatalf("list snapshots of another sandbox: %d %v", code, list)
	}
	var created map[string]any
	if code := e.api("POST", "/sandboxes", `{"templateID":"e2b-snap","timeout":60}`, &created); code != 201 {
		t.Fatalf("create from the snapshot: %d %v", code, created)
	}
	restored := created["sandboxID"].(string)
	if err := e.m.Delete(t.Context(), restored); err != nil {
		t.Fatal(err)
	}
	var forks []map[string]any
	if code := e.api("POST", "/sandboxes/"+e.id+"/fork", `{"count":2,"timeout":30}`, &forks); code != 201 || len(forks) != 2 {
		t.Fatalf("fork: %d %v", code, forks)
	}
	for _, f := range forks {
		sb, ok := f["sandbox"].(map[string]any)
		if !ok || sb["envdAccessToken"] == "" {
			t.Fatalf("fork result %v", f)
		}
		got, err := e.m.Get(context.Background(), sb["sandboxID"].(string))
		if err != nil || got.Deadline.Sub(got.CreatedAt) > 31e9 {
			t.Fatalf("forked sandbox %+v (%v), want a 30 s timeout", got, err)
		}
		if err := e.m.Delete(t.Context(), got.ID); err != nil {
			t.Fatal(err)
		}
	}
	var out map[string]any
	if code := e.api("POST", "/sandboxes/"+e.id+"/fork", `{"count":99}`, &out); code != 400 {
		t.Fatalf("fork of 99: %d %v", code, out)
	}
	if code := e.api("DELETE", "/templates/e2b-snap", "", nil); code != 204 {
		t.Fatalf("delete snapshot: %d", code)
	}
	out = nil
	if code := e.api("DELETE", "/templates/e2b-snap", "", &out); code != 404 {
		t.Fatalf("delete of a deleted snapshot: %d %v", code, out)
	}
	out = nil
	// A template a sandbox uses stays: 409, and it is still there.
	if code := e.api("DELETE", "/templates/bb", "", &out); code != 409 {
		t.Fatalf("delete of a template in use: %d %v", code, out)
	}
	if code := e.api("GET", "/templates/aliases/bb", "", nil); code != 200 {
		t.Fatalf("template after a refused delete: %d", code)
	}
}

// Network updates: what the policy cannot express is refused with 400, a
// sandbox without a managed network with 409.
func TestUpdateNetwork(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		body string
		code int
	}{
		{`{}`, 400},
		{`{"denyOut":["10.0.0.0/8"]}`, 400},
		{`{"rules":{"x":{}}}`, 400},
		{`{"rules":{"x.test":[{"transform":{"cookies":{}}}]}}`, 400},
		{`{"rules":{"x.test":[{"transform":{"headers":{"X-Key":"{{secret:k}}"}}}]}}`, 409},
		{`{"allow_internet_access":true}`, 409},
	} {
		var out map[string]any
		if code := e.api("PUT", "/sandboxes/"+e.id+"/network", tt.body, &out); code != tt.code || out["code"] != float64(tt.code) {
			t.Errorf("update %s: %d %v, want %d", tt.body, code, out, tt.code)
		}
	}
}
