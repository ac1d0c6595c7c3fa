package server

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	corral "github.com/corralrun/corral/sdk"
)

func TestRunOverHTTP(t *testing.T) {
	c, ts := newTestServer(t, "")
	ctx := t.Context()

	var out, errOut bytes.Buffer
	var created *corral.Sandbox
	sb, res, err := c.Run(ctx, corral.RunOptions{
		Sandbox: corral.CreateOptions{Template: "bb", Env: map[string]string{"X": "1"}},
		Exec:    corral.ExecOptions{Shell: "echo $X; echo oops >&2; exit 3", Stdout: &out, Stderr: &errOut},
		Created: func(sb *corral.Sandbox) { created = sb },
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb == nil || sb.State != "running" || created == nil || created.ID != sb.ID {
		t.Fatalf("run returned %+v, Created got %+v", sb, created)
	}
	if res.ExitCode != 3 || out.String() != "1\n" || errOut.String() != "oops\n" || res.PID == 0 {
		t.Fatalf("run: %+v %q %q", res, out.String(), errOut.String())
	}
	// Without Remove the sandbox stays.
	if _, err := c.Get(ctx, sb.ID); err != nil {
		t.Fatalf("sandbox after run: %v", err)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// With Remove it is gone when Run returns, whether the command ran or
	// could not start.
	sb, res, err = c.Run(ctx, corral.RunOptions{Sandbox: corral.CreateOptions{Template: "bb"}, Exec: corral.ExecOptions{Cmd: []string{"true"}}, Remove: true})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run with remove: %+v %v", res, err)
	}
	if _, err := c.Get(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("sandbox after run with remove: %v", err)
	}
	sb, _, err = c.Run(ctx, corral.RunOptions{Sandbox: corral.CreateOptions{Template: "bb"}, Exec: corral.ExecOptions{Cmd: []string{"definitely-not-a-command"}}, Remove: true})
	if corral.ErrorCode(err) != corral.CodeNotFound || sb == nil {
		t.Fatalf("run of a missing command: %+v %v", sb, err)
	}
	if _, err := c.Get(ctx, sb.ID); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("sandbox after a failed run with remove: %v", err)
	}

	// A create that fails is an ordinary error, with nothing made.
	if sb, _, err := c.Run(ctx, corral.RunOptions{Sandbox: corral.CreateOptions{Template: "nope"}, Exec: corral.ExecOptions{Cmd: []string{"true"}}}); corral.ErrorCode(err) != corral.CodeNotFound || sb != nil {
		t.Fatalf("run on a missing template: %+v %v", sb, err)
	}
	for _, body := range []string{
		`{"sandbox":{"template":"bb"},"exec":{}}`,
		`{"sandbox":{"template":"bb","memory_mb":-1},"exec":{"cmd":["true"]}}`,
		`{"sandbox":{"template":"bb"},"exec":{"cmd":["true"]},"bogus":1}`,
	} {
		resp, err := http.Post(ts.URL+"/v1/run", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /v1/run %s: status %d, want 400", body, resp.StatusCode)
		}
	}
	if list, err := c.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes left: %v %v", list, err)
	}
}
