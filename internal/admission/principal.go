package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

type principalKey struct{}

// WithPrincipal returns ctx naming the principal a create is made for,
// for per-principal limits. The server sets it per listener and key;
// creates without one share the principal "".
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// Principal returns the principal ctx names (WithPrincipal), or "".
func Principal(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}

// APIKeyPrincipal names the principal of an API key without holding the
// key itself: a short digest, safe to log.
func APIKeyPrincipal(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:6])
}

// PoolPrincipal holds the claims of unclaimed warm pool members: they
// count against host capacity, and against a caller's limit only once
// claimed (ReserveKey, Assign). No API key maps to it.
const PoolPrincipal = "\x00pool"
