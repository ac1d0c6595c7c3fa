package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
	corral "github.com/corralrun/corral/sdk"
)

// BenchmarkExecRoundTrip measures one `true` in a running runc sandbox
// three ways, interleaved in rounds on the same sandbox so that all see
// the same load: through the Go SDK (the peer), through the exec tool of
// `corral mcp` over stdio, and through the exec tool at the daemon's /mcp
// over streamable HTTP (both with the Go MCP SDK's client). It reports
// each one's p50 and what MCP adds to the Go SDK's. b.N counts rounds of
// 20 samples of each.
func BenchmarkExecRoundTrip(b *testing.B) {
	testutil.RequiresRoot(b)
	testutil.RequiresBinary(b, "runc")
	testutil.RequiresBinary(b, "busybox")
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	apiKey := hex.EncodeToString(key)
	addr := testutil.FreeLoopbackAddr(b)
	d := daemontest.New(b, daemontest.Options{Name: "mcp-bench", Storage: "overlay",
		Args: []string{"--api-key", apiKey, "--listen", addr, "--runtime", "runc"}})
	d.BuildBusybox("base")
	ctx := context.Background()
	sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "base", Timeout: corral.NoTimeout})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Client.Delete(ctx, sb.ID)

	connect := func(t mcp.Transport) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil).Connect(ctx, t, nil)
		if err != nil {
			b.Fatal(err)
		}
		return cs
	}
	cmd := exec.Command(d.Bin, "mcp")
	cmd.Env = []string{"CORRAL_HOST=unix://" + d.Socket}
	stdio := connect(&mcp.CommandTransport{Command: cmd})
	defer stdio.Close()
	streamable := connect(&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp",
		HTTPClient: keyClient(apiKey)})
	defer streamable.Close()

	sdk := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			start := time.Now()
			res, err := d.Client.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"true"}})
			out[i] = time.Since(start)
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("exec true: %v %+v", err, res)
			}
		}
		return out
	}
	tool := func(cs *mcp.ClientSession) func(int) []time.Duration {
		return func(n int) []time.Duration {
			out := make([]time.Duration, n)
			for i := range out {
				start := time.Now()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "true", "sandbox_id": sb.ID}})
				out[i] = time.Since(start)
				if err != nil || res.IsError {
					b.Fatalf("exec tool: %v %+v", err, res)
				}
			}
			return out
		}
	}
	ways := []struct {
		name string
		run  func(int) []time.Duration
	}{{"sdk", sdk}, {"stdio", tool(stdio)}, {"http", tool(streamable)}}
	samples := make([][]time.Duration, len(ways))
	for _, w := range ways {
		w.run(20) // warm connections and the sandbox
	}
	b.ResetTimer()
	for range b.N {
		for i, w := range ways {
			samples[i] = append(samples[i], w.run(20)...)
		}
	}
	b.StopTimer()
	base := p50(samples[0])
	for i, w := range ways {
		p := p50(samples[i])
		b.ReportMetric(float64(p.Microseconds())/1000, w.name+"-p50-ms")
		if i > 0 {
			b.ReportMetric(float64((p-base).Microseconds())/1000, w.name+"-minus-sdk-ms")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// keyClient is an HTTP client that sends the API key with every request.
func keyClient(key string) *http.Client {
	return &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
}

type bearer struct {
	key  string
	next http.RoundTripper
}

func (t bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.key)
	return t.next.RoundTrip(r)
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
