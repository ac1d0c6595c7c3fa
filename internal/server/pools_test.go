package server

import (
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

func TestPoolsAPI(t *testing.T) {
	c, _ := newTestServer(t, "")
	ctx := t.Context()
	p, err := c.SetPool(ctx, "warm", corral.PoolOptions{Template: "bb", Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "warm" || p.Runtime != "fake" || p.CPUs != 0.5 || p.MemoryMB != 128 || p.Network != "none" || p.Size != 1 {
		t.Fatalf("pool %+v", p)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Ready != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", p)
		}
		time.Sleep(10 * time.Millisecond)
		if p, err = c.GetPool(ctx, "warm"); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := c.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("list shows pool members: %v %+v", err, list)
	}
	sb, err := c.Create(ctx, corral.CreateOptions{Pool: "warm", IdleTimeout: 90 * time.Second, Env: map[string]string{"X": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.IdleTimeout != 90 || sb.OnIdle != corral.ActionDestroy || sb.OnDeadline != corral.ActionDestroy || sb.Deadline == nil {
		t.Fatalf("claimed %+v", sb)
	}
	sb, err = c.Update(ctx, sb.ID, corral.UpdateOptions{IdleTimeout: corral.Timeout(0), MemoryMB: 64})
	if err != nil || sb.IdleTimeout != 0 || sb.MemoryMB != 64 {
		t.Fatalf("update: %v %+v", err, sb)
	}
	for _, tt := range []struct {
		name string
		err  func() error
		code string
	}{
		{"unknown action", func() error {
			_, err := c.Update(ctx, sb.ID, corral.UpdateOptions{OnDeadline: "boom"})
			return err
		}, corral.CodeInvalidArgument},
		{"negative idle timeout", func() error {
			_, err := c.Create(ctx, corral.CreateOptions{Template: "bb", IdleTimeout: -time.Second})
			return err
		}, corral.CodeInvalidArgument},
		{"unknown pool", func() error { _, err := c.GetPool(ctx, "nope"); return err }, corral.CodeNotFound},
		{"pool without template", func() error {
			_, err := c.SetPool(ctx, "x", corral.PoolOptions{Template: "nope", Size: 1})
			return err
		}, corral.CodeNotFound},
		{"claim from unknown pool", func() error {
			_, err := c.Create(ctx, corral.CreateOptions{Pool: "nope"})
			return err
		}, corral.CodeNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := corral.ErrorCode(tt.err()); got != tt.code {
				t.Fatalf("code %q, want %q", got, tt.code)
			}
		})
	}
	pools, err := c.Pools(ctx)
	if err != nil || len(pools) != 1 {
		t.Fatalf("pools: %v %+v", err, pools)
	}
	if err := c.DeletePool(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePool(ctx, "warm"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
