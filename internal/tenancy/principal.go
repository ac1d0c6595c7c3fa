package tenancy

import "context"

// Principal is the caller of a request: the key it authenticated with and
// the tenant that key acts for. The zero Principal is no one; a context
// without one is the daemon itself (timers, reconciliation), which may
// act on everything.
type Principal struct {
	// Tenant owns what the principal creates; "" is the operator (the
	// unix socket, the --api-key key and other admin keys acting for
	// themselves).
	Tenant string
	// Key names the key ("" on the unix socket).
	Key string
	// Admin keys see and act on every tenant's objects.
	Admin bool
	// Quota bounds what the tenant may hold; zero fields are unlimited.
	Quota Quota
}

// Quota bounds one tenant.
type Quota struct {
	Sandboxes        int   `json:"max_sandboxes,omitempty"`
	MemoryBytes      int64 `json:"max_memory_bytes,omitempty"`
	MilliCPUs        int64 `json:"max_millicpus,omitempty"`
	DiskBytes        int64 `json:"max_disk_bytes,omitempty"`
	CreatesPerMinute int   `json:"creates_per_minute,omitempty"`
}

// Sees reports whether the principal may see and act on an object owned
// by tenant owner: admins see everything, tenants their own objects.
func (p Principal) Sees(owner string) bool { return p.Admin || p.Tenant == owner }

// Operator is the principal of the root-only unix socket.
var Operator = Principal{Admin: true}

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal ctx carries; ok is false for the daemon's own
// work, which is not a request.
func From(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// Sees reports whether the caller of ctx may see an object of tenant
// owner: the daemon's own work sees everything.
func Sees(ctx context.Context, owner string) bool {
	p, ok := From(ctx)
	return !ok || p.Sees(owner)
}

// Owner is the tenant that objects the caller of ctx creates belong to.
func Owner(ctx context.Context) string {
	p, _ := From(ctx)
	return p.Tenant
}

// AsDaemon returns ctx without its principal: for the daemon's own work
// done during a request, such as handing a pool member (the operator's
// until claimed) to the caller.
func AsDaemon(ctx context.Context) context.Context { return context.WithValue(ctx, ctxKey{}, nil) }
