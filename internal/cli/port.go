package cli

import (
	"fmt"
	"strconv"
	"strings"

	corral "github.com/corralrun/corral/sdk"
)

// port prints the URL at which the daemon forwards to a sandbox's port.
// Over the unix socket it prints the URL for curl --unix-socket, and how.
func (c *cli) port(args []string) int {
	fs := c.flags("port")
	err := fs.Parse(args)
	var port int
	if err == nil {
		if fs.NArg() != 2 {
			err = fmt.Errorf("want ID PORT")
		} else if port, err = strconv.Atoi(fs.Arg(1)); err == nil && (port < 1 || port > 65535) {
			err = fmt.Errorf("port %d out of range", port)
		}
	}
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "usage: corral port ID PORT")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	id := fs.Arg(0)
	if _, err := client.Get(ctx, id); err != nil {
		return c.fail(err)
	}
	u := client.PortURL(id, port)
	host := c.env.Getenv("CORRAL_HOST")
	if host == "" {
		host = corral.DefaultHost
	}
	if sock, ok := strings.CutPrefix(host, "unix://"); ok {
		u = "http://localhost" + u[strings.Index(u, "/v1/"):]
		fmt.Fprintf(c.env.Stderr, "the daemon listens on a unix socket: curl --unix-socket %s %s\n", sock, u)
	}
	fmt.Fprintln(c.env.Stdout, u)
	return 0
}
