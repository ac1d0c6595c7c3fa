package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/network/nettest"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/testutil/daemontest"
	corral "github.com/corralrun/corral/sdk"
)

// netWorld is a daemon whose sandboxes' "internet" is the test's own: a
// namespace with HTTP servers a and b (nettest.Internet, 198.18.x.0/24)
// and a DNS upstream on loopback that knows example.test (server a),
// other.test (server b) and bad.test (server a, whose certificate does not
// name it). The daemon trusts the servers' CA (SSL_CERT_FILE) where it
// verifies them itself, as it trusts the host's CAs. No test traffic
// leaves loopback and the namespaces the test made.
type netWorld struct {
	d       *daemon
	in      *nettest.Internet
	a, b    string // server addresses
	runtime string // of the sandboxes the test creates
}

// netRuntimes are the runtimes every network test runs on: the rules live
// on the host, so gVisor's netstack must meet the same policy as runc.
func netRuntimes() []string { return []string{"runc", "gvisor"} }

// forEachNetRuntime runs f once per runtime of netRuntimes.
func forEachNetRuntime(t *testing.T, f func(t *testing.T, runtime string)) {
	for _, rt := range netRuntimes() {
		t.Run(rt, func(t *testing.T) { f(t, rt) })
	}
}

func newNetWorld(t *testing.T, storage, runtime string) *netWorld {
	t.Helper()
	requireHost(t)
	extra := []string{}
	if runtime == "gvisor" {
		testutil.RequiresBinary(t, "runsc")
		extra = append(extra, "--runtimes", "gvisor")
	}
	in := nettest.NewInternet(t, "cei"+randHex(4), "example.test", "other.test")
	up := nettest.StartUpstream(t, map[string][]string{
		"example.test": {in.A.String()},
		"other.test":   {in.B.String()},
		"bad.test":     {in.A.String()},
	})
	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, in.Certs.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonWith(t, daemontest.Options{Storage: storage,
		Args: append(extra, "--dns-upstream", up.Addr.String()), Env: []string{"SSL_CERT_FILE=" + roots}})
	return &netWorld{d: d, in: in, a: in.A.String(), b: in.B.String(), runtime: runtime}
}

// create creates a sandbox on the world's runtime.
func (w *netWorld) create(t *testing.T, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	opts.Runtime = w.runtime
	return w.d.create(t, opts)
}

// sh runs a shell script in a sandbox and returns its combined output and
// exit code.
func (w *netWorld) sh(t *testing.T, id, script string) (string, int) {
	t.Helper()
	out, res := w.d.execOut(t, id, script)
	return out, res.ExitCode
}

// TestNetworkAllowlist: with an allowlist naming
// example.test, `corral run` reaches the test's own server by name, and
// every other name or address fails with a clear error.
func TestNetworkAllowlist(t *testing.T) {
	forEachNetRuntime(t, func(t *testing.T, runtime string) { testNetworkAllowlist(t, "overlay", runtime) })
}

func testNetworkAllowlist(t *testing.T, storage, runtime string) {
	w := newNetWorld(t, storage, runtime)
	d := w.d
	out, errOut, code := d.corral("run", "--runtime", runtime, "--template", "bb", "--network", "allowlist", "--allow-domain", "example.test",
		"--", "wget", "-qO-", "http://example.test/")
	if code != 0 || nettest.Field(out, "server") != "a" || nettest.Field(out, "host") != "example.test" {
		t.Fatalf("allowed domain: code %d, stdout %q, stderr %q\nlogs:\n%s", code, out, errOut, d.Logs())
	}

	sb := w.create(t, corral.CreateOptions{Network: &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"example.test"}}})
	// Through the explicit proxy (HTTP_PROXY, set by the daemon) and the
	// transparent one (wget -Y off connects to the address it resolved).
	for _, proxy := range []string{"on", "off"} {
		out, code := w.sh(t, sb.ID, "wget -Y "+proxy+" -qO- http://example.test/")
		if code != 0 || nettest.Field(out, "server") != "a" {
			t.Errorf("allowed domain with proxy %s: code %d, %q", proxy, code, out)
		}
	}
	// HTTPS, through CONNECT (HTTPS_PROXY, set by the daemon) and through
	// the transparent proxy, which judges the SNI. busybox's TLS client is
	// too old for Go's server: nettool is a Go client.
	d.installNettool(t, sb.ID)
	for _, env := range []string{"", "HTTPS_PROXY= https_proxy="} {
		out, code := w.sh(t, sb.ID, env+" "+nettoolPath+" get https://example.test/")
		if code != 0 || nettest.Field(out, "server") != "a" || nettest.Field(out, "sni") != "example.test" {
			t.Errorf("allowed domain over https (env %q): code %d, %q", env, code, out)
		}
	}
	refused := []struct {
		name, script, want string
	}{
		{"other name via proxy", "wget -qO- http://other.test/", "403"},
		{"other name resolved", "wget -Y off -qO- http://other.test/", "bad address"},
		{"other name in DNS", "nslookup other.test", "NXDOMAIN"},
		{"other name through another DNS server", "nslookup other.test " + w.b, "NXDOMAIN"},
		{"other name over https", "HTTPS_PROXY= https_proxy= " + nettoolPath + " get https://other.test/", "no such host"},
		{"other name over https via proxy", nettoolPath + " get https://other.test/", "Forbidden"},
		{"other address over https", "HTTPS_PROXY= https_proxy= " + nettoolPath + " get https://" + w.b + "/", "access denied"},
		{"IPv6", "nc -w 3 2001:db8::1 80 </dev/null && echo connected", ""},
		{"other address", "wget -Y off -qO- http://" + w.b + "/", "403"},
		{"other address via proxy", "wget -qO- http://" + w.b + "/", "403"},
		{"other port", "nc -w 3 " + w.b + " 8080 </dev/null && echo connected", ""},
		{"metadata address", "timeout 5 wget -Y off -qO- http://169.254.169.254/", "403"},
		{"host's other ports", "nc -w 3 $(awk '/^nameserver/ {print $2}' /etc/resolv.conf) 22 </dev/null && echo connected", ""},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			out, code := w.sh(t, sb.ID, tt.script)
			t.Logf("%s: %q", tt.script, out)
			if code == 0 || strings.Contains(out, "connected") || !strings.Contains(out, tt.want) {
				t.Errorf("%s: code %d, output %q; want a failure saying %q", tt.script, code, out, tt.want)
			}
		})
	}
	// The proxy dials the name, never the address the sandbox chose: a
	// request to b's address for example.test reaches a.
	out, code = w.sh(t, sb.ID, "wget -Y off -qO- --header 'Host: example.test' http://"+w.b+"/")
	if code != 0 || nettest.Field(out, "server") != "a" {
		t.Errorf("Host example.test sent to b's address: code %d, %q; want server a", code, out)
	}
}

// TestNetworkLiveUpdate replaces a running sandbox's allowlist through the
// CLI and checks that it takes effect within a second, both ways.
func TestNetworkLiveUpdate(t *testing.T) {
	forEachNetRuntime(t, func(t *testing.T, runtime string) { testNetworkLiveUpdate(t, "overlay", runtime) })
}

func testNetworkLiveUpdate(t *testing.T, storage, runtime string) {
	w := newNetWorld(t, storage, runtime)
	d := w.d
	sb := w.create(t, corral.CreateOptions{Network: &corral.NetworkPolicy{AllowDomains: []string{"example.test"}}})
	if sb.Network == nil || sb.Network.Mode != "allowlist" {
		t.Fatalf("rules without a mode: policy %+v, want allowlist", sb.Network)
	}
	if _, code := w.sh(t, sb.ID, "wget -qO- http://other.test/"); code == 0 {
		t.Fatal("other.test reachable before the update")
	}
	out, errOut, code := d.corral("network", sb.ID, "--allow-domain", "other.test")
	if code != 0 || !strings.Contains(out, "allow-domain: other.test") {
		t.Fatalf("corral network: code %d, %q %q", code, out, errOut)
	}
	updated := time.Now()
	for _, tt := range []struct {
		host, want string
		ok         bool
	}{{"other.test", "b", true}, {"example.test", "", false}} {
		for {
			out, code := w.sh(t, sb.ID, "wget -qO- http://"+tt.host+"/")
			if (code == 0) == tt.ok && nettest.Field(out, "server") == tt.want {
				break
			}
			if time.Since(updated) > time.Second {
				t.Fatalf("%s after the update: code %d, %q", tt.host, code, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("update effective after %s", time.Since(updated))
	if _, errOut, code := d.corral("network", sb.ID, "--mode", "none"); code == 0 || !strings.Contains(errOut, "new sandbox") {
		t.Errorf("switching to none: code %d, %q; want a failed precondition", code, errOut)
	}
	if out, _, code := d.corral("network", sb.ID); code != 0 || out != "mode: allowlist\nallow-domain: other.test\n" {
		t.Errorf("corral network ID: code %d, %q", code, out)
	}
}

// TestNetworkHeaders injects a header on requests to example.test: it
// arrives at the server, and the API never shows its value.
func TestNetworkHeaders(t *testing.T) {
	forEachNetRuntime(t, func(t *testing.T, runtime string) { testNetworkHeaders(t, "overlay", runtime) })
}

func testNetworkHeaders(t *testing.T, storage, runtime string) {
	w := newNetWorld(t, storage, runtime)
	d := w.d
	const secret = "Bearer e2e-s3cret"
	sb := w.create(t, corral.CreateOptions{Network: &corral.NetworkPolicy{
		AllowDomains: []string{"example.test"},
		Headers:      []corral.HeaderRule{{Domain: "example.test", Name: "Authorization", Value: secret}},
	}})
	for _, proxy := range []string{"on", "off"} {
		out, code := w.sh(t, sb.ID, "wget -Y "+proxy+" -qO- --header 'Authorization: mine' http://example.test/")
		if code != 0 || !strings.Contains(out, "auth="+secret+"\n") {
			t.Errorf("proxy %s: code %d, %q; want the injected header", proxy, code, out)
		}
	}
	out, _, code := d.corral("inspect", sb.ID)
	if code != 0 || strings.Contains(out, "s3cret") || !strings.Contains(out, "Authorization") {
		t.Errorf("inspect shows %q", out)
	}
	// No trace inside: not in the environment of execs or of PID 1 (the
	// agent, whose environment sandbox processes cannot even read: it is
	// not dumpable), not in any file. The pattern is assembled by the shell so
	// that the script itself does not contain it; /tmp/control holds it
	// to show that the search finds it. (find -type f: busybox grep -r
	// reads every applet symlink.)
	script := `p=s3c; p=${p}ret; echo "$p" >/tmp/control; env | grep -c "$p"; { tr '\0' '\n' </proc/1/environ; } 2>/dev/null | grep -c "$p"; ` +
		`find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -exec grep -l "$p" {} + 2>/dev/null; echo done`
	if out, _ := w.sh(t, sb.ID, script); out != "0\n0\n/tmp/control\ndone\n" {
		t.Errorf("the secret is visible in the sandbox: %q", out)
	}
	if strings.Contains(d.Logs(), "s3cret") {
		t.Error("the daemon logged the secret")
	}
}

// TestNetworkNoneAndRestart checks the default mode (loopback only, name
// lookups fail at once) and that a restarted daemon adopts the networks of
// the sandboxes it keeps, policies included.
func TestNetworkNoneAndRestart(t *testing.T) {
	forEachNetRuntime(t, func(t *testing.T, runtime string) { testNetworkNoneAndRestart(t, "btrfs", runtime) })
}

func testNetworkNoneAndRestart(t *testing.T, storage, runtime string) {
	w := newNetWorld(t, storage, runtime)
	d := w.d
	none := w.create(t, corral.CreateOptions{})
	if none.Network == nil || none.Network.Mode != "none" {
		t.Fatalf("default policy %+v, want none", none.Network)
	}
	// gVisor has no /sys/class/net; both answer netlink.
	out, code := w.sh(t, none.ID, "ip -o link | awk -F': ' '{print $2}'; cat /etc/resolv.conf; wget -qO- http://"+w.a+"/ 2>&1; nslookup example.test 2>&1")
	if code == 0 || !strings.HasPrefix(out, "lo\nnameserver 127.0.0.1\n") || strings.Contains(out, "server=") {
		t.Errorf("mode none: code %d, %q", code, out)
	}
	open := w.create(t, corral.CreateOptions{Network: &corral.NetworkPolicy{AllowDomains: []string{"example.test"}}})
	d.Stop()
	d.Start()
	out, code = w.sh(t, open.ID, "wget -qO- http://example.test/")
	if code != 0 || nettest.Field(out, "server") != "a" {
		t.Fatalf("after restart: code %d, %q\nlogs:\n%s", code, out, d.Logs())
	}
	if _, code := w.sh(t, open.ID, "wget -qO- http://other.test/"); code == 0 {
		t.Error("after restart the policy no longer holds")
	}
}

// TestNetworkManySandboxes sets up and tears down the networks of a batch
// of sandboxes; the harness then checks that no interface, namespace, nft
// table, address or route is left. (internal/network's own tests do 100.)
func TestNetworkManySandboxes(t *testing.T) {
	forEachNetRuntime(t, func(t *testing.T, runtime string) { testNetworkManySandboxes(t, "overlay", runtime) })
}

func testNetworkManySandboxes(t *testing.T, storage, runtime string) {
	w := newNetWorld(t, storage, runtime)
	d := w.d
	var ids []string
	for i := range 10 {
		p := &corral.NetworkPolicy{AllowDomains: []string{"example.test"}}
		if i%2 == 1 {
			p = &corral.NetworkPolicy{Mode: "none"}
		}
		ids = append(ids, w.create(t, corral.CreateOptions{Network: p}).ID)
	}
	if out, code := w.sh(t, ids[0], "wget -qO- http://example.test/"); code != 0 || nettest.Field(out, "server") != "a" {
		t.Errorf("first sandbox: code %d, %q", code, out)
	}
	// Once the daemon has made spare networks (--network-spares), a
	// create of each kind takes one, and works as well.
	for _, p := range []*corral.NetworkPolicy{{AllowDomains: []string{"example.test"}}, {Mode: "none"}} {
		deadline := time.Now().Add(10 * time.Second)
		for readySpares(d.Logs(), p.Mode != "none") == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		id := w.create(t, corral.CreateOptions{Network: p}).ID
		ids = append(ids, id)
		if !regexp.MustCompile(`msg="network set up" sandbox_id=` + id + ` .*spare=true`).MatchString(d.Logs()) {
			t.Errorf("sandbox %s (%s) was not given a spare network; logs:\n%s", id, p.Mode, d.Logs())
		}
	}
	if out, code := w.sh(t, ids[len(ids)-2], "wget -qO- http://example.test/; wget -qO- http://other.test/"); nettest.Field(out, "server") != "a" || code == 0 {
		t.Errorf("sandbox on a spare network: code %d, %q", code, out)
	}
	start := time.Now()
	for _, id := range ids {
		if err := d.Client.Delete(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("deleted %d sandboxes in %s", len(ids), time.Since(start))
}

// readySpares counts from a daemon's debug log the spare networks of one
// kind (with a veth, or not) made and not yet taken.
func readySpares(logs string, link bool) int {
	made := regexp.MustCompile(`msg="spare network made" .*slot=(-?\d+)`).FindAllStringSubmatch(logs, -1)
	taken := regexp.MustCompile(`msg="network set up" .*mode=(\w+) .*spare=true`).FindAllStringSubmatch(logs, -1)
	n := 0
	for _, m := range made {
		if (m[1] != "-1") == link {
			n++
		}
	}
	for _, m := range taken {
		if (m[1] != "none") == link {
			n--
		}
	}
	return n
}
