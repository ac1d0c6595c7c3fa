package e2e

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/network/nettest"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestDefaultTemplate builds the default template with the debian recipe
// through the daemon, as the README's install does, and checks the README's
// promise: `corral run -- python3 -c 'print(6*7)'` prints 42. It runs
// debootstrap against the Debian mirror (2-4 minutes), so it runs only with
// CORRAL_TEST_DEBOOTSTRAP=1, which .ci/run sets.
func TestDefaultTemplate(t *testing.T) {
	if testing.Short() || os.Getenv("CORRAL_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set CORRAL_TEST_DEBOOTSTRAP=1 to build the Debian template (minutes, needs the Debian mirror)")
	}
	requireHost(t)
	// The daemon of a network world: the test's own "internet" answers
	// for example.test (network_test.go).
	w := newNetWorld(t, "btrfs", "runc")
	d := w.d
	ctx := t.Context()
	start := time.Now()
	var log strings.Builder
	if _, err := d.Client.BuildTemplate(ctx, "default", corral.BuildOptions{Recipe: "debian"}, &log); err != nil {
		t.Fatalf("building the default template: %v\n%s", err, tail(log.String(), 40))
	}
	t.Logf("default template built in %s", time.Since(start).Round(time.Second))

	out, errOut, code := d.corral("run", "--", "python3", "-c", "print(6*7)")
	if code != 0 || out != "42\n" {
		t.Fatalf("corral run python3: code %d stdout %q stderr %q", code, out, errOut)
	}
	checks := []struct {
		name, shell, want string
	}{
		{"node", "node -e 'console.log(6*7)'", "42"},
		{"npm", "npm --version >/dev/null && echo ok", "ok"},
		{"git", "git --version", "git version"},
		{"pip in venv", "python3 -m venv /tmp/v && /tmp/v/bin/pip --version", "pip"},
		{"bash", "bash -c 'echo $BASH_VERSION'", "5."},
		{"non-root user", "su user -c id", "uid=1000(user)"},
		// Mode none: Corral's own file (a resolver on loopback that is not
		// there), never the host's.
		{"no host resolv.conf", `[ "$(cat /etc/resolv.conf)" = "nameserver 127.0.0.1" ] && echo own`, "own"},
	}
	sb := d.create(t, corral.CreateOptions{Template: "default"})
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			got, res := d.execOut(t, sb.ID, c.shell)
			if res.ExitCode != 0 || !strings.Contains(got, c.want) {
				t.Fatalf("%s: exit %d output %q, want %q", c.shell, res.ExitCode, got, c.want)
			}
		})
	}
	// The egress check, with the template's real curl: an allowed name is
	// reached over HTTPS (through the proxy that the daemon's HTTPS_PROXY
	// names; -k because the test's server has a certificate of the test's
	// own CA), another name or an address is refused with a clear error.
	allow := []string{"run", "--network", "allowlist", "--allow-domain", "example.test", "--", "curl", "-sSk"}
	out, errOut, code = d.corral(append(allow, "https://example.test/")...)
	if code != 0 || nettest.Field(out, "server") != "a" || nettest.Field(out, "sni") != "example.test" {
		t.Errorf("curl https://example.test/: code %d stdout %q stderr %q", code, out, errOut)
	}
	for _, url := range []string{"https://other.test/", "https://" + w.b + "/"} {
		out, errOut, code = d.corral(append(allow, url)...)
		if code == 0 || !strings.Contains(errOut, "403") {
			t.Errorf("curl %s: code %d stdout %q stderr %q; want a failure naming the proxy's 403", url, code, out, errOut)
		}
	}
	// Two sandboxes of the same template do not see each other's writes.
	other := d.create(t, corral.CreateOptions{Template: "default"})
	d.execOut(t, sb.ID, "echo mine > /root/f")
	if out, res := d.execOut(t, other.ID, "cat /root/f 2>&1 || true"); strings.Contains(out, "mine") || res.ExitCode != 0 {
		t.Fatalf("sandbox sees another sandbox's file: %q", out)
	}
	for _, rt := range netRuntimes() {
		t.Run("secrets over HTTPS/"+rt, func(t *testing.T) {
			if rt == "gvisor" {
				testutil.RequiresBinary(t, "runsc")
			}
			checkSecretsOverHTTPS(t, w, rt)
		})
	}
	checkPythonService(t, d)
}

// checkPythonService gives the default template a service, the template's
// own Python serving HTTP, set with the CLI: sandboxes on runc and gVisor
// are running only once the server answers. A Python that never listens
// fails the create with its output. The service is removed again.
func checkPythonService(t *testing.T, d *daemon) {
	testutil.RequiresBinary(t, "runsc")
	serve := []string{"template", "service", "default", "--start",
		"mkdir -p /tmp/www && cat /proc/sys/kernel/hostname > /tmp/www/id && exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www",
		"--ready-url", "http://127.0.0.1:8000/id"}
	if _, errOut, code := d.corral(serve...); code != 0 {
		t.Fatalf("corral template service: %d %q", code, errOut)
	}
	t.Cleanup(func() { d.corral("template", "service", "default", "--clear") })
	for _, rt := range []string{"runc", "gvisor"} {
		sb := d.create(t, corral.CreateOptions{Template: "default", Runtime: rt})
		// The ready check passed, so the first request finds the server.
		got, res := d.execOut(t, sb.ID, `python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/id").read().decode().strip())'`)
		if res.ExitCode != 0 || got != sb.ID+"\n" {
			t.Errorf("%s: the Python service answers %q (exit %d), want the sandbox's hostname", rt, got, res.ExitCode)
		}
		if st, err := d.Client.SandboxService(t.Context(), sb.ID); err != nil || st.State != corral.ServiceReady {
			t.Errorf("%s: service status %+v, %v; want ready", rt, st, err)
		}
	}
	never := []string{"template", "service", "default", "--start", "echo no port here; exec python3 -c 'import time; time.sleep(600)'",
		"--ready-port", "8000", "--ready-timeout", "2s"}
	if _, errOut, code := d.corral(never...); code != 0 {
		t.Fatalf("corral template service: %d %q", code, errOut)
	}
	_, err := d.Client.Create(t.Context(), corral.CreateOptions{Template: "default"})
	var e *corral.Error
	if !errors.As(err, &e) || e.Code != corral.CodeFailedPrecondition || !strings.Contains(e.Message, "no port here") {
		t.Errorf("create with a Python that never listens: %v, want failed_precondition with its output", err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
