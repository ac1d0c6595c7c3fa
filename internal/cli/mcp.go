package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corralmcp "github.com/corralrun/corral/internal/mcp"
	corral "github.com/corralrun/corral/sdk"
)

// mcpServe serves the MCP tools over stdio to one client (Claude Desktop,
// Claude Code, Cursor...), talking to the daemon at CORRAL_HOST. Its
// session sandbox is deleted when the client disconnects or the command
// is interrupted. Diagnostics go to stderr: stdout is the protocol.
func (c *cli) mcpServe(args []string) int {
	fs := c.flags("mcp")
	var p corralmcp.Policy
	p.Flags(fs, "")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error (written to stderr)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.env.Stderr, "corral mcp: unexpected arguments %v\n", fs.Args())
		return exitUsage
	}
	if err := p.Check(); err != nil {
		fmt.Fprintf(c.env.Stderr, "corral mcp: %v\n", err)
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(c.env.Stderr, "corral mcp: invalid --log-level %q\n", *logLevel)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(c.env.Stderr, &slog.HandlerOptions{Level: level}))
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	// A daemon that is down is said once here; every tool call then
	// answers the same as a tool error until it is up.
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := client.Health(hctx); err != nil {
		log.Warn("the Corral daemon does not answer; tools fail until it does", "host", c.host(), "error", err)
	}
	hcancel()
	cfg := corralmcp.Config{
		Client:  func(http.Header) (*corral.Client, error) { return client, nil },
		Policy:  p,
		Version: Version,
		Logger:  log,
	}
	if sock, ok := strings.CutPrefix(c.host(), "unix://"); ok {
		cfg.UnixSocket = sock
	}
	// Stdin comes through a pipe, which closing interrupts: a read of
	// the real stdin would block the session's end until the next line.
	// The copying goroutine may stay blocked on stdin until the process
	// exits, which follows the session's end at once.
	in, feed := io.Pipe()
	go func() { _, err := io.Copy(feed, c.env.Stdin); feed.CloseWithError(err) }()
	srv := corralmcp.New(cfg)
	err = srv.Run(ctx, &mcp.IOTransport{Reader: in, Writer: nopWriteCloser{c.env.Stdout}})
	in.Close()
	if err != nil {
		fmt.Fprintf(c.env.Stderr, "corral mcp: %v\n", err)
		return exitCLI
	}
	return 0
}

// nopWriteCloser leaves stdout open when the transport closes.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// host is the daemon address the client uses.
func (c *cli) host() string {
	if h := c.env.Getenv("CORRAL_HOST"); h != "" {
		return h
	}
	return corral.DefaultHost
}
