// Command corral is Corral's single binary: the daemon (`corral server`),
// the CLI, and the in-sandbox agent (`corral agent`).
package main

import (
	"os"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/cli"
	"github.com/corralrun/corral/internal/daemon"
)

func main() {
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	server := func(args []string) int { return daemon.Main(args, cli.Version) }
	os.Exit(cli.Main(os.Args[1:], env, server, agentserver.Main))
}
