package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
	corral "github.com/corralrun/corral/sdk"
)

// TestOutOfRangeFields sends every numeric request field below and above
// its documented range, and values whose conversion would overflow: each
// answers 400 invalid_argument naming the field, and a refused PATCH
// changes nothing.
func TestOutOfRangeFields(t *testing.T) {
	c, ts := newTestServer(t, "")
	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	const huge = "9223372036854775807"
	create, patch := "/v1/sandboxes", "/v1/sandboxes/"+sb.ID
	tests := []struct {
		path, body, field string
	}{
		{create, `{"template":"bb","cpus":1e9}`, "cpus"},
		{create, `{"template":"bb","cpus":1e-9}`, "cpus"},
		{create, `{"template":"bb","cpus":-1}`, "cpus"},
		{create, `{"template":"bb","memory_mb":8}`, "memory_mb"},
		{create, `{"template":"bb","memory_mb":17592186045440}`, "memory_mb"}, // (1<<44)+512: <<20 wraps to 512 MiB
		{create, `{"template":"bb","memory_mb":-1}`, "memory_mb"},
		{create, `{"template":"bb","pids":100000000}`, "pids"},
		{create, `{"template":"bb","pids":` + huge + `}`, "pids"},
		{create, `{"template":"bb","disk_mb":` + huge + `}`, "disk_mb"},
		{create, `{"template":"bb","disk_mb":-1}`, "disk_mb"},
		{create, `{"template":"bb","timeout":` + huge + `}`, "timeout"},
		{create, `{"template":"bb","timeout":-1}`, "timeout"},
		{create, `{"template":"bb","idle_timeout":` + huge + `}`, "idle_timeout"},
		{create, `{"template":"bb","idle_timeout":-1}`, "idle_timeout"},
		{"/v1/run", `{"sandbox":{"template":"bb","cpus":1e9},"exec":{"cmd":["true"]}}`, "cpus"},
		{"/v1/run", `{"sandbox":{"template":"bb"},"exec":{"cmd":["true"],"timeout_ms":` + huge + `}}`, "timeout_ms"},
		{"/v1/run", `{"sandbox":{"template":"bb"},"exec":{"cmd":["true"],"max_output_bytes":-1}}`, "max_output_bytes"},
		{patch, `{"memory_mb":64,"pids":` + huge + `}`, "pids"},
		{patch, `{"pids":100000000}`, "pids"},
		{patch, `{"cpus":1e9}`, "cpus"},
		{patch, `{"cpus":1e-9}`, "cpus"},
		{patch, `{"memory_mb":` + huge + `}`, "memory_mb"},
		{patch, `{"memory_mb":256,"idle_timeout":` + huge + `}`, "idle_timeout"},
		{patch, `{"idle_timeout":-1}`, "idle_timeout"},
		{patch + "/timeout", `{"timeout":` + huge + `}`, "timeout"},
		{patch + "/timeout", `{"timeout":-5}`, "timeout"},
		{patch + "/resume", `{"timeout":` + huge + `}`, "timeout"},
		{patch + "/fork", `{"count":0}`, "count"},
		{patch + "/fork", `{"count":17}`, "count"},
		{patch + "/exec", `{"cmd":["true"],"timeout_ms":-1}`, "timeout_ms"},
		{patch + "/exec", `{"cmd":["true"],"max_output_bytes":` + huge + `}`, "max_output_bytes"},
		{patch + "/processes", `{"cmd":["true"],"timeout_ms":` + huge + `}`, "timeout_ms"},
		{patch + "/processes", `{"cmd":["sh"],"pty":{"cols":0,"rows":24}}`, "cols"},
		{patch + "/processes", `{"cmd":["sh"],"pty":{"cols":80,"rows":70000}}`, "rows of type uint16"},
		{patch + "/processes/1/resize", `{"cols":80,"rows":0}`, "rows"},
		{patch + "/files/mkdir", `{"path":"/d","mode":4096}`, "mode"},
		{"/v1/pools/p", `{"template":"bb","size":257}`, "size"},
		{"/v1/pools/p", `{"template":"bb","size":-1}`, "size"},
		{"/v1/pools/p", `{"template":"bb","size":1,"cpus":1e9}`, "cpus"},
		{"/v1/pools/p", `{"template":"bb","size":1,"memory_mb":` + huge + `}`, "memory_mb"},
	}
	for _, tt := range tests {
		t.Run(tt.path+" "+tt.body, func(t *testing.T) {
			method := http.MethodPost
			switch {
			case tt.path == patch:
				method = http.MethodPatch
			case strings.HasPrefix(tt.path, "/v1/pools/"):
				method = http.MethodPut
			}
			want := tt.field
			if !strings.Contains(want, " ") {
				want += " must be from"
			}
			checkRefused(t, method, ts.URL+tt.path, tt.body, want)
		})
	}
	for _, q := range []string{"ports/0/", "ports/65536/", "files?path=/f&mode=10000"} {
		method := http.MethodGet
		if strings.HasPrefix(q, "files") {
			method = http.MethodPut
		}
		want := "port \"" // the path value, quoted
		if method == http.MethodPut {
			want = "mode \"10000\""
		}
		checkRefused(t, method, ts.URL+patch+"/"+q, "", want)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.MemoryMB != sb.MemoryMB || got.Pids != sb.Pids || got.CPUs != sb.CPUs || got.IdleTimeout != sb.IdleTimeout {
		t.Errorf("after the refused updates: %+v, %v; want the limits of %+v", got, err, sb)
	}
	if list, _ := c.List(ctx, corral.ListOptions{}); len(list) != 1 {
		t.Errorf("%d sandboxes after the refused creates, want 1", len(list))
	}
}

// checkRefused sends body and wants 400 invalid_argument with a message
// that has want.
func checkRefused(t *testing.T, method, url, body, want string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e wire.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("%s %s: status %d, body not an error: %v", method, url, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusBadRequest || e.Error.Code != errdefs.CodeInvalidArgument || !strings.Contains(e.Error.Message, want) {
		t.Errorf("%s %s %s: %d %+v; want 400 invalid_argument saying %q", method, url, body, resp.StatusCode, e.Error, want)
	}
}

// TestErrorsWithoutHostPaths: an internal error reaches the client as its
// kind and a reference only, and another error without the host paths of
// the system errors in it; the log has each in full, with the sandbox and
// the reference.
func TestErrorsWithoutHostPaths(t *testing.T) {
	var logs bytes.Buffer
	s := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	cgroupFile := "/sys/fs/cgroup/pids/corral/sb1/pids.max"
	socket := "/run/corral/runc/sandboxes/sb1/agent.sock"
	tests := []struct {
		name     string
		err      error
		code     string
		keep     string // part of the message the client still gets
		hostPath string
	}{
		{"internal", fmt.Errorf("updating limits of sandbox sb1: %w", &os.PathError{Op: "write", Path: cgroupFile, Err: errors.New("invalid argument")}),
			errdefs.CodeInternal, "internal error", cgroupFile},
		{"internal with the path in the message only", fmt.Errorf("removing cgroup %s: device or resource busy", cgroupFile),
			errdefs.CodeInternal, "internal error", cgroupFile},
		{"unavailable", fmt.Errorf("exec in sandbox sb1: %w", errors.Join(errdefs.ErrUnavailable,
			&net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: socket, Net: "unix"}, Err: errors.New("connection refused")})), errdefs.CodeUnavailable, "exec in sandbox sb1", socket},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs.Reset()
			r := httptest.NewRequest(http.MethodPatch, "/v1/sandboxes/sb1", nil)
			r.SetPathValue("id", "sb1")
			w := httptest.NewRecorder()
			s.writeError(w, r, tt.err)
			b, _ := io.ReadAll(w.Body)
			var e wire.ErrorBody
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Code != tt.code || !strings.Contains(e.Error.Message, tt.keep) || strings.Contains(string(b), tt.hostPath) {
				t.Errorf("client got %s; want code %s, %q and no %s", b, tt.code, tt.keep, tt.hostPath)
			}
			ref := e.Error.Message[strings.Index(e.Error.Message, "error_ref=")+len("error_ref="):]
			ref = strings.TrimRight(ref, ")")
			line := logs.String()
			for _, want := range []string{tt.hostPath, "sandbox_id=sb1", "error_ref=" + ref} {
				if !strings.Contains(line, want) {
					t.Errorf("log %q does not have %q", line, want)
				}
			}
		})
	}
	// An error without host paths goes out as it is, unlogged.
	logs.Reset()
	r := httptest.NewRequest(http.MethodGet, "/v1/sandboxes/sb1/files", nil)
	w := httptest.NewRecorder()
	s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "open /work/x: no such file or directory"))
	if !strings.Contains(w.Body.String(), "open /work/x: no such file or directory") || logs.Len() != 0 {
		t.Errorf("a sandbox's own error became %s (log %q)", w.Body, logs.String())
	}
}
