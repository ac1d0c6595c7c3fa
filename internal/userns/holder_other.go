//go:build !amd64

package userns

// holderProgram has no program for this architecture: the daemon clones
// the holder into the namespace and it re-executes this binary
// (Holder).
func holderProgram() []byte { return nil }
