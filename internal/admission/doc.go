// Package admission decides whether the daemon accepts one more sandbox:
// it keeps the budget of host capacity (sandbox count, committed memory
// and CPU), the per-principal limits and the starting slots, and the FIFO
// queue of creates that wait for them.
//
// It knows sandboxes only by ID and Claim. It does not create, persist or
// delete anything: the caller (the sandbox Manager) reserves before it
// acquires resources and releases when the sandbox is gone.
package admission
