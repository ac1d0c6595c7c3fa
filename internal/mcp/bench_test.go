package mcp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkExec measures what MCP adds to a command's round trip: the
// same `true` in the same sandbox through the Go SDK (the peer), through
// the exec tool over the in-memory transport, and over the streamable
// HTTP transport on loopback. The API is served over the fake driver, so
// the differences are the protocol's and the tool's own cost.
func BenchmarkExec(b *testing.B) {
	c := api(b)
	ctx := b.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		b.Fatal(err)
	}
	args := map[string]any{"command": "true", "sandbox_id": sb.ID}
	b.Run("sdk", func(b *testing.B) {
		for b.Loop() {
			if res, err := c.Exec(ctx, sb.ID, corral.ExecOptions{Shell: "true", Stdout: io.Discard}); err != nil || res.ExitCode != 0 {
				b.Fatal(res, err)
			}
		}
	})
	srv := New(Config{Client: func(http.Header) (*corral.Client, error) { return c, nil }, Logger: slog.New(slog.DiscardHandler)})
	defer srv.Close()
	call := func(b *testing.B, cs *mcp.ClientSession) {
		for b.Loop() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: args})
			if err != nil || res.IsError {
				b.Fatal(res, err)
			}
		}
	}
	b.Run("mcp-memory", func(b *testing.B) {
		st, ct := mcp.NewInMemoryTransports()
		done := make(chan error, 1)
		go func() { done <- srv.Run(context.Background(), st) }()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil).Connect(ctx, ct, nil)
		if err != nil {
			b.Fatal(err)
		}
		call(b, cs)
		cs.Close()
		<-done
	})
	b.Run("mcp-http", func(b *testing.B) {
		ts := httptest.NewServer(srv.HTTPHandler(time.Minute))
		defer ts.Close()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL}, nil)
		if err != nil {
			b.Fatal(err)
		}
		call(b, cs)
		cs.Close()
	})
}
