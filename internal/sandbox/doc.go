// Package sandbox is Corral's domain: what a sandbox is (Spec, Sandbox,
// State and its transition table) and the Manager that creates, tracks,
// times out and destroys sandboxes by wiring a driver, a storage backend and
// the store together.
//
// The Manager owns lifecycle decisions: it persists every sandbox before it
// acquires the first resource, undoes partial work on failure, reconciles the
// store with the host after a restart, and destroys sandboxes whose deadline
// passed. It does not speak HTTP, build OCI specs or mount file systems.
package sandbox
