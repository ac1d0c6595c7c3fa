package cli

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

func TestNodeLs(t *testing.T) {
	answer := `[{"name":"node-a","advertise":"10.0.0.1:7000","runtimes":["gvisor","runc"],"templates":["bb","debian"],
		"capacity":{"millicpus":8000,"memory_bytes":17179869184},
		"load":{"sandboxes":3,"running":2,"reserved_millicpus":1500,"reserved_memory_bytes":1073741824},
		"updated_at":"2026-01-02T15:04:05Z"}]`
	status := http.StatusOK
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.URL.Path != "/v1/nodes" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	defer ts.Close()
	out, errOut := new(bytes.Buffer), new(bytes.Buffer)
	env := Env{Stdin: strings.NewReader(""), Stdout: out, Stderr: errOut, Getenv: func(k string) string {
		if k == "CORRAL_HOST" {
			return ts.URL
		}
		return ""
	}}
	run := func(args ...string) int {
		out.Reset()
		errOut.Reset()
		return Main(args, env, nil, nil)
	}

	if code := run("node", "ls"); code != 0 {
		t.Fatalf("node ls: exit %d; stderr %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || strings.Fields(lines[0])[0] != "NAME" {
		t.Fatalf("node ls printed %q", out)
	}
	fields := strings.Fields(lines[1])
	if diff := cmp.Diff([]string{"node-a", "10.0.0.1:7000", "gvisor,runc", "2", "3", "2", "1.5/8", "1.0G/16.0G"}, fields[:8]); diff != "" {
		t.Errorf("node ls row (-want +got):\n%s", diff)
	}

	if code := run("node", "ls", "--json"); code != 0 {
		t.Fatalf("node ls --json: exit %d; stderr %s", code, errOut)
	}
	if !strings.Contains(out.String(), `"reserved_millicpus": 1500`) {
		t.Errorf("node ls --json printed %s", out)
	}

	status, answer = http.StatusConflict, `{"error":{"code":"failed_precondition","message":"this daemon is not in a cluster"}}`
	if code := run("node", "ls"); code != exitCLI || !strings.Contains(errOut.String(), "not in a cluster") {
		t.Errorf("node ls outside a cluster: exit %d, stderr %q", code, errOut)
	}
	for _, args := range [][]string{{"node"}, {"node", "drain", "a"}, {"node", "ls", "x"}} {
		if code := run(args...); code != exitUsage {
			t.Errorf("%q: exit %d, want usage", args, code)
		}
	}
}

func TestPrintNodesAge(t *testing.T) {
	out := new(bytes.Buffer)
	c := &cli{env: Env{Stdout: out}}
	now := time.Date(2026, 1, 2, 15, 4, 10, 0, time.UTC)
	c.printNodes([]corral.Node{{Name: "a", UpdatedAt: now.Add(-3 * time.Second)}}, now)
	if !strings.Contains(out.String(), "3s ago") {
		t.Errorf("printNodes: %q, want the record's age", out)
	}
}
