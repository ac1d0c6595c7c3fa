package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// webService serves "hello" over HTTP on the sandbox's port 8080 with
// busybox's httpd, ready once the page answers.
const webService = `{"shell": "mkdir -p /tmp/www && echo hello > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
	"ready": {"url": "http://127.0.0.1:8080/", "interval_ms": 50}}`

// neverService starts but never listens on the port its ready check
// waits for.
const neverService = `{"shell": "echo never listening; exec sleep 1000",
	"ready": {"port": 9, "interval_ms": 100}, "ready_timeout_ms": 3000}`

// rawAPI sends one request to the daemon's REST API over its socket and
// returns the status and body.
func (d *daemon) rawAPI(t testing.TB, method, path, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dd net.Dialer
		return dd.DialContext(ctx, "unix", d.Socket)
	}}}
	req, err := http.NewRequestWithContext(t.Context(), method, "http://corral"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serviceTemplate builds busybox template name with service sv (JSON of
// a template service).
func (d *daemon) serviceTemplate(t testing.TB, name, sv string) {
	t.Helper()
	d.BuildBusybox(name)
	if code, body := d.rawAPI(t, http.MethodPut, "/v1/templates/"+name+"/service", sv); code != http.StatusOK {
		t.Fatalf("PUT service of template %s: %d %s", name, code, body)
	}
}

// TestTemplateService starts sandboxes of a template whose service is a
// real HTTP server, on runc and gVisor: each create returns with the
// server answering, its status says ready, and a stop and start run it
// again. A service that never becomes ready fails the create within its
// ready timeout with failed_precondition and its output, and leaves
// nothing behind (the daemon's leak checks).
func TestTemplateService(t *testing.T) {
	d := startGVisorDaemon(t)
	d.serviceTemplate(t, "web", webService)
	d.serviceTemplate(t, "never", neverService)
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			sb := d.create(t, corral.CreateOptions{Template: "web", Runtime: rt})
			d.checkWeb(t, sb.ID)
			if rt == "runc" {
				if _, err := d.Client.Stop(t.Context(), sb.ID); err != nil {
					t.Fatal(err)
				}
				if _, err := d.Client.Start(t.Context(), sb.ID, nil); err != nil {
					t.Fatal(err)
				}
				d.checkWeb(t, sb.ID)
			}
			if err := d.Client.Delete(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			d.checkNeverReady(t, rt)
		})
	}
}

// checkWeb checks that sandbox id's web service answers and says ready.
func (d *daemon) checkWeb(t *testing.T, id string) {
	t.Helper()
	if out, res := d.execOut(t, id, "wget -qO- http://127.0.0.1:8080/"); res.ExitCode != 0 || out != "hello\n" {
		t.Fatalf("the service does not answer once the sandbox runs: exit %d, %q", res.ExitCode, out)
	}
	code, body := d.rawAPI(t, http.MethodGet, "/v1/sandboxes/"+id+"/service", "")
	if code != http.StatusOK || !strings.Contains(body, `"state":"ready"`) {
		t.Fatalf("GET service: %d %s", code, body)
	}
}

// checkNeverReady creates a sandbox of template "never" on runtime rt,
// which must fail in time and leave no sandbox and no root.
func (d *daemon) checkNeverReady(t *testing.T, rt string) {
	t.Helper()
	begin := time.Now()
	_, err := d.Client.Create(t.Context(), corral.CreateOptions{Template: "never", Runtime: rt})
	took := time.Since(begin)
	var e *corral.Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || e.Code != corral.CodeFailedPrecondition {
		t.Fatalf("create of a never ready service: %v, want 409 failed_precondition", err)
	}
	if !strings.Contains(e.Message, "service not ready") || !strings.Contains(e.Message, "never listening") {
		t.Fatalf("error %q: want the reason and the start command's output", e.Message)
	}
	t.Logf("never ready on %s after %s: %s", rt, took.Round(time.Millisecond), e.Message)
	// The ready timeout (3 s) and a sandbox's start.
	if took > 20*time.Second {
		t.Fatalf("create failed after %s", took)
	}
	if list, _ := d.Client.List(t.Context(), corral.ListOptions{}); len(list) != 0 {
		t.Fatalf("a failed create left sandboxes: %+v", list)
	}
	if roots, _ := os.ReadDir(rootsDir(d)); len(roots) != 0 {
		t.Fatalf("a failed create left %d roots", len(roots))
	}
}

// TestTemplateServicePoolBacksOff defines a pool of a template whose
// service never becomes ready: `corral pool ls` says why it is empty.
func TestTemplateServicePoolBacksOff(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	d.serviceTemplate(t, "never", neverService)
	d.removePoolAtCleanup(t, "np")
	if _, errOut, code := d.corral("pool", "set", "np", "--template", "never", "--size", "1"); code != 0 {
		t.Fatalf("corral pool set: %d %q", code, errOut)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, errOut, code := d.corral("pool", "ls")
		if code != 0 {
			t.Fatalf("corral pool ls: %d %q", code, errOut)
		}
		if strings.Contains(out, "service not ready") && strings.Contains(out, "never listening") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("corral pool ls never said why the pool is empty:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
