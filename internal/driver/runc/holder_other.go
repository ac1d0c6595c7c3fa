//go:build !amd64

package runc

// holderProgram has no program for this architecture: the daemon clones
// the holder into the namespace and it re-executes this binary
// (installHolder).
func holderProgram() []byte { return nil }
