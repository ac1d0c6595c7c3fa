//go:build !amd64

package seccomp

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Compile has no system-call table here; sandboxes' profiles go to the
// runtime instead (see Compile).
const (
	nativeArch specs.Arch = ""
	auditArch             = 0
	x32Bit                = 0
)

var sysNums map[string]int
