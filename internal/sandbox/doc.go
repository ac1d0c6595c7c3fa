// Package sandbox is Corral's domain: what a sandbox is (Spec, Sandbox,
// State and its transition table) and the Manager that creates, tracks,
// times out and destroys sandboxes by wiring a driver, a storage backend and
// the store together.
//
// The Manager owns lifecycle decisions: it admits a create (package
// admission) before it acquires anything, makes the sandbox's record, root
// and network at once and starts its instance only once the record is in,
// so that reconcile finds what a crash leaves; it undoes partial work on
// failure, reconciles the store with the host after a restart, and
// destroys sandboxes whose deadline passed. Every state change goes
// through transition (transition.go). It does not speak HTTP, build OCI
// specs or mount file systems.
package sandbox
