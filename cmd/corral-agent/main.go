// Command corral-agent is the in-sandbox agent alone: the same code as
// `corral agent`, in a binary that links nothing of the daemon. It is up
// sooner than the full corral binary, which initializes every package of
// the daemon first (docs/BENCHMARKS.md), and a sandbox cannot answer
// before its agent does. The daemon runs it when it lies next to
// its own executable, is static and comes from the same commit (or when
// --agent names it), and itself as `corral agent` otherwise.
//
// It takes the arguments of `corral agent`, with or without the leading
// "agent", so that drivers start either binary the same way. Its
// "interpreter" command is the code interpreter service
// (`/.corral/agent interpreter`, the code-interpreter template's start
// command).
package main

import (
	"os"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/interpreter"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "interpreter" {
		os.Exit(interpreter.Main(args[1:]))
	}
	if len(args) > 0 && args[0] == "agent" {
		args = args[1:]
	}
	os.Exit(agentserver.Main(args))
}
