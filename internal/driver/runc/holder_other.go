//go:build !amd64

package runc

// holderProgram has no program for this architecture: the holder
// re-executes this binary (installHolder).
func holderProgram() []byte { return nil }
