// Package ocirt holds what the drivers built on an OCI runtime command line
// (runc, gVisor's runsc) share: running the runtime and reading its errors,
// the cgroup files of a sandbox (stats, freezer state, removal), process
// helpers, sandbox ID rules, template mount points and the flags a bind
// of a host mount must keep.
//
// It knows nothing of a particular runtime's flags or state layout, writes
// no OCI spec, and keeps no state: every function works on the paths and
// values it is given.
package ocirt
