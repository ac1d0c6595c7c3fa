// Package bench runs Corral's standard benchmark scenarios against a
// running daemon through the public SDK (exec round trip, cold create to
// first output, burst of concurrent creates, density of idle sandboxes) and,
// on request, the same cold start on peers run bare on this host (runc,
// runsc, bwrap, podman) and the exec round trip on the OCI runtimes among
// them (runc exec, runsc exec), and prints the results as a table or JSON.
//
// It owns the measurement and its clean-up: every sandbox, peer container
// and temporary directory it makes is removed before Run returns, also when
// the context is canceled. It does not start or configure the daemon and
// makes no claims a benchmark did not measure: a scenario the daemon cannot
// run yet is reported as not available, never with a made-up number.
package bench
