// Command corral is Corral's single binary: the daemon (`corral server`),
// the CLI, the in-sandbox agent (`corral agent`) and the code interpreter
// service of the code-interpreter template (`corral interpreter`, run in a
// sandbox as its agent binary).
package main

import (
	"os"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/cli"
	"github.com/corralrun/corral/internal/daemon"
	"github.com/corralrun/corral/internal/interpreter"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "interpreter" {
		os.Exit(interpreter.Main(os.Args[2:]))
	}
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	server := func(args []string) int { return daemon.Main(args, cli.Version) }
	os.Exit(cli.Main(os.Args[1:], env, server, agentserver.Main))
}
