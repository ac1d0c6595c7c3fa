package drivertest

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/wire"
)

// agentClient wraps the agent client (package agentclient) with the few calls
// the suite makes; every connection comes from the driver's DialAgent.
type agentClient struct {
	c *agentclient.Client
}

func newAgentClient(d driver.Driver, id string) *agentClient {
	return &agentClient{c: agentclient.New(func(ctx context.Context) (net.Conn, error) {
		return d.DialAgent(ctx, id)
	})}
}

func (a *agentClient) close() { a.c.Close() }

func (a *agentClient) health(ctx context.Context) (wire.Health, error) {
	return a.c.Health(ctx)
}

// execResult is the collected outcome of one exec.
type execResult struct {
	stdout, stderr string
	exitCode       int
	signal         string
	oomKilled      bool
}

func (a *agentClient) exec(ctx context.Context, req wire.ExecRequest) (execResult, error) {
	var res execResult
	var out, errOut strings.Builder
	err := a.c.Exec(ctx, req, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout:
			out.Write(ev.Bytes())
		case wire.EventStderr:
			errOut.Write(ev.Bytes())
		case wire.EventExit:
			if ev.ExitCode != nil {
				res.exitCode = *ev.ExitCode
			}
			res.signal, res.oomKilled = ev.Signal, ev.OOMKilled
		}
		return nil
	})
	res.stdout, res.stderr = out.String(), errOut.String()
	return res, err
}

func (a *agentClient) writeFile(ctx context.Context, path string, data []byte) error {
	_, err := a.c.WriteFile(ctx, path, 0o644, bytes.NewReader(data))
	return err
}

func (a *agentClient) readFile(ctx context.Context, path string) ([]byte, error) {
	r, _, err := a.c.ReadFile(ctx, path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// ExecOnce runs a shell command in instance id of d through a new agent
// client and returns its stdout and stderr, interleaved: for a driver's
// own tests, beside the suite.
func ExecOnce(ctx context.Context, d driver.Driver, id, script string) (string, error) {
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	var out strings.Builder
	err := c.Exec(ctx, wire.ExecRequest{Shell: script}, func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventStdout || ev.Type == wire.EventStderr {
			out.Write(ev.Bytes())
		}
		return nil
	})
	return out.String(), err
}
