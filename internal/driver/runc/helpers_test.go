package runc

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/wire"
)

func writeJSON(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(name, b, 0o600)
}

// execOnce runs a shell command through a new agent client and returns
// its stdout.
func execOnce(ctx context.Context, d *Driver, id, script string) (string, error) {
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	var out strings.Builder
	err := c.Exec(ctx, wire.ExecRequest{Shell: script}, func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventStdout {
			out.Write(ev.Bytes())
		}
		return nil
	})
	return out.String(), err
}

func fileOwner(t testing.TB, name string) uint32 {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}
