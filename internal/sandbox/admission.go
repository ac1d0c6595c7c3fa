package sandbox

import "github.com/corralrun/corral/internal/admission"

// claimOf returns the claim sandbox sb holds: an unclaimed pool member's
// counts for admission.PoolPrincipal, so that it takes host capacity but
// no caller's share.
func claimOf(sb Sandbox) admission.Claim {
	p := sb.Owner
	if sb.Pool != "" {
		p = admission.PoolPrincipal
	}
	return admission.Claim{Principal: p, MemoryBytes: sb.MemoryBytes, MilliCPUs: sb.MilliCPUs}
}
