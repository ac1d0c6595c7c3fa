package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestRunInOneCall covers the one-call run on real runc, whose exec
// request reaches the agent while runc still starts the sandbox: the
// output and environment come through, --keep keeps the sandbox, and a
// client that goes away mid-command leaves nothing behind.
func TestRunInOneCall(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	ctx := t.Context()

	var out strings.Builder
	sb, res, err := d.Client.Run(ctx, corral.RunOptions{
		Sandbox: corral.CreateOptions{Template: "bb", Env: map[string]string{"A": "6"}},
		Exec:    corral.ExecOptions{Shell: "echo $((A*B)); exit 5", Env: map[string]string{"B": "7"}, Stdout: &out},
		Remove:  true,
	})
	if err != nil || res.ExitCode != 5 || out.String() != "42\n" {
		t.Fatalf("run: %+v %v, output %q", res, err, out.String())
	}
	if _, err := d.Client.Get(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("sandbox after run with remove: %v", err)
	}

	stdout, stderr, code := d.corral("run", "--keep", "--template", "bb", "--", "echo", "kept")
	id := strings.TrimSpace(stderr)
	if code != 0 || stdout != "kept\n" || id == "" {
		t.Fatalf("run --keep: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if out, _ := d.execOut(t, id, "echo still here"); out != "still here\n" {
		t.Fatalf("kept sandbox answers %q", out)
	}
	if err := d.Client.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}

	// The client gives up while the command runs: the daemon kills it and
	// deletes the sandbox.
	rctx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	_, _, err = d.Client.Run(rctx, corral.RunOptions{
		Sandbox: corral.CreateOptions{Template: "bb"},
		Exec: corral.ExecOptions{Shell: "echo up; sleep 600", Stdout: writerFunc(func(p []byte) (int, error) {
			close(started)
			cancel()
			return len(p), nil
		})},
		Remove: true,
	})
	<-started
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run given up: %v", err)
	}
	testutil.WaitFor(t, func() bool {
		list, err := d.Client.List(ctx, corral.ListOptions{})
		return err == nil && len(list) == 0
	})
}
