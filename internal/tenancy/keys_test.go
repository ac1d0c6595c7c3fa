package tenancy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestKeys(t *testing.T) {
	ctx := t.Context()
	store := NewMemStore()
	ks, err := NewKeys(ctx, store, "boot")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ks.Authenticate("boot"); err != nil || !p.Admin || p.Key != BootstrapName {
		t.Fatalf("bootstrap key: %+v %v", p, err)
	}
	k, secret, err := ks.Create(ctx, KeyOptions{Name: "a", Quota: Quota{Sandboxes: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "crl_") || len(secret) != 47 || k.Hash != Digest(secret) || k.Tenant != "a" {
		t.Fatalf("created %+v, secret %q", k, secret)
	}
	if stored, _ := store.Keys(ctx); len(stored) != 1 || strings.Contains(stored[0].Hash, secret) || stored[0].Hash == secret {
		t.Fatalf("stored %+v", stored)
	}
	p, err := ks.Authenticate(secret)
	if err != nil || p != (Principal{Tenant: "a", Key: "a", Quota: Quota{Sandboxes: 2}}) {
		t.Fatalf("principal %+v %v", p, err)
	}
	if !p.Sees("a") || p.Sees("b") || p.Sees("") || !Operator.Sees("b") {
		t.Fatal("Sees")
	}
	// Records survive a restart.
	again, err := NewKeys(ctx, store, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Authenticate(secret); err != nil {
		t.Fatalf("after reload: %v", err)
	}
	if _, err := again.Authenticate("boot"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("bootstrap key without --api-key: %v", err)
	}

	revoked := ks.Revoked()
	_, secret2, err := ks.Rotate(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked:
	default:
		t.Fatal("rotation did not signal a revocation")
	}
	if _, err := ks.Authenticate(secret); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("old secret after rotation: %v", err)
	}
	if _, err := ks.Authenticate(secret2); err != nil {
		t.Fatalf("new secret: %v", err)
	}
	if err := ks.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Authenticate(secret2); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("deleted key: %v", err)
	}
	for _, tt := range []struct {
		o    KeyOptions
		kind error
	}{
		{KeyOptions{Name: ""}, errdefs.ErrInvalidArgument},
		{KeyOptions{Name: "UPPER"}, errdefs.ErrInvalidArgument},
		{KeyOptions{Name: strings.Repeat("x", 64)}, errdefs.ErrInvalidArgument},
		{KeyOptions{Name: BootstrapName}, errdefs.ErrInvalidArgument},
		{KeyOptions{Name: "b", Tenant: "a b"}, errdefs.ErrInvalidArgument},
		{KeyOptions{Name: "b", Quota: Quota{Sandboxes: -1}}, errdefs.ErrInvalidArgument},
	} {
		if _, _, err := ks.Create(ctx, tt.o); !errors.Is(err, tt.kind) {
			t.Errorf("create %+v: %v", tt.o, err)
		}
	}
	if _, _, err := ks.Rotate(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("rotate unknown: %v", err)
	}
	for _, s := range []string{"", "crl_wrong", "boot "} {
		if _, err := ks.Authenticate(s); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("authenticate %q: %v", s, err)
		}
	}
}

// TestWatch ends the context of a key that is deleted or rotated, with
// an unauthenticated cause, and leaves other keys' contexts running.
func TestWatch(t *testing.T) {
	ctx := t.Context()
	ks, err := NewKeys(ctx, NewMemStore(), "boot")
	if err != nil {
		t.Fatal(err)
	}
	_, a, err := ks.Create(ctx, KeyOptions{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := ks.Create(ctx, KeyOptions{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	actx, stopA := ks.Watch(ctx, a)
	defer stopA()
	bctx, stopB := ks.Watch(ctx, b)
	defer stopB()
	bootCtx, stopBoot := ks.Watch(ctx, "boot")
	defer stopBoot()
	if err := ks.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-actx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a deleted key's context is not done")
	}
	if cause := context.Cause(actx); !errors.Is(cause, errdefs.ErrUnauthenticated) {
		t.Errorf("cause %v, want unauthenticated", cause)
	}
	time.Sleep(10 * time.Millisecond) // b's watch checks its key again
	if bctx.Err() != nil {
		t.Errorf("b's context ended with a's key: %v", context.Cause(bctx))
	}
	if _, _, err := ks.Rotate(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a rotated key's context is not done")
	}
	if bootCtx.Err() != nil {
		t.Errorf("the --api-key key's context ended: %v", context.Cause(bootCtx))
	}
	_, c, err := ks.Create(ctx, KeyOptions{Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopC := ks.Watch(ctx, c)
	stopC()
	if cctx.Err() == nil {
		t.Error("the context outlives its watch")
	}
}
