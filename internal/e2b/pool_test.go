package e2b

import (
	"context"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/sandbox"
)

// An E2B create of a pool's shape gets a sandbox from the pool, with the
// request's env.
func TestCreateClaimsFromPool(t *testing.T) {
	e := newEnv(t)
	if _, err := e.m.SetPool(t.Context(), sandbox.Pool{Name: "warm", Template: "bb", Size: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.m.RemovePool(context.Background(), "warm") })
	// A member is listed from the start of its create; it can be claimed
	// once the pool counts it ready.
	var member string
	for deadline := time.Now().Add(10 * time.Second); member == ""; {
		if st, err := e.m.PoolStatus("warm"); err == nil && st.Ready == 1 {
			for _, sb := range e.m.List(context.Background(), sandbox.Filter{Pooled: true}) {
				if sb.Pool == "warm" {
					member = sb.ID
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("pool never filled")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var created map[string]any
	if code := e.api("POST", "/v2/sandboxes", `{"templateID":"bb","timeout":60,"envVars":{"K":"v"}}`, &created); code != 201 {
		t.Fatalf("create: %d %v", code, created)
	}
	if got := created["sandboxID"]; got != member {
		t.Fatalf("E2B create made %v, not the pool's %s", got, member)
	}
	sb, err := e.m.Get(context.Background(), member)
	if err != nil || sb.Env["K"] != "v" || sb.Pool != "" {
		t.Fatalf("claimed sandbox %+v (%v)", sb, err)
	}
	if err := e.m.Delete(t.Context(), member); err != nil {
		t.Fatal(err)
	}
}
