package e2e

import (
	"bytes"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/network/nettest"
	corral "github.com/corralrun/corral/sdk"
)

// Secret values of checkSecretsOverHTTPS. Scripts inside sandboxes never
// spell them whole (see noTrace).
const (
	httpsSecret  = "https-s3cret-one"
	httpsRotated = "https-s3cret-two"
)

// checkSecretsOverHTTPS checks secrets injected at egress over HTTPS on
// runtime, with the default template's own TLS clients (curl through the
// proxy, Python's requests through the proxy, Node's fetch straight to the
// address, which the host redirects): a header naming a stored secret
// arrives at the test's server over TLS that the sandbox trusts, rotation
// applies from the next request, the value is nowhere inside the sandbox,
// a server whose certificate does not match is refused, and a placeholder
// is swapped only on requests to its rule's domain.
func checkSecretsOverHTTPS(t *testing.T, w *netWorld, runtime string) {
	d, ctx := w.d, t.Context()
	name := "api-" + runtime
	cmd := d.corralCmd("secret", "create", name)
	cmd.Stdin = strings.NewReader(httpsSecret + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("corral secret create: %v: %s", err, out)
	}
	t.Cleanup(func() { _, _, _ = d.corral("secret", "rm", name) })
	// An unknown secret is refused at create, with the reason.
	_, errOut, code := d.corral("create", "--runtime", runtime, "--template", "default", "--allow-domain", "example.test",
		"--inject-header", "example.test:Authorization=Bearer {{secret:nosuch}}")
	if code == 0 || !strings.Contains(errOut, "nosuch") {
		t.Errorf("create naming an unknown secret: code %d, %q", code, errOut)
	}

	sb := d.create(t, corral.CreateOptions{Template: "default", Runtime: runtime, Network: &corral.NetworkPolicy{
		AllowDomains: []string{"example.test", "bad.test"},
		Headers: []corral.HeaderRule{
			{Domain: "example.test", Name: "Authorization", Value: "Bearer {{secret:" + name + "}}"},
			{Domain: "bad.test", Name: "Authorization", Value: "Bearer {{secret:" + name + "}}"},
		},
	}})
	clients := map[string]string{
		"curl":     "curl -sS https://example.test/",
		"requests": `python3 -c 'import requests; print(requests.get("https://example.test/").text, end="")'`,
		"fetch":    `node -e 'fetch("https://example.test/").then(r => r.text()).then(t => process.stdout.write(t))'`,
	}
	for client, script := range clients {
		out, res := d.execOut(t, sb.ID, script)
		if res.ExitCode != 0 || !strings.HasSuffix(out, "auth=Bearer "+httpsSecret+"\n") || nettest.Field(out, "sni") != "example.test" {
			t.Errorf("%s: exit %d, %q; want the secret in the header, over TLS", client, res.ExitCode, out)
		}
	}
	if _, err := d.Client.RotateSecret(ctx, name, httpsRotated); err != nil {
		t.Fatal(err)
	}
	if out, _ := d.execOut(t, sb.ID, clients["curl"]); !strings.Contains(out, "auth=Bearer "+httpsRotated+"\n") {
		t.Errorf("after rotation: %q", out)
	}
	// The proxy verifies the real server: bad.test's certificate names
	// other hosts, so the request fails there, with no fallback to an
	// unverified connection.
	if out, _ := d.execOut(t, sb.ID, "curl -s -o /dev/null -w '%{http_code}' https://bad.test/"); out != "502" {
		t.Errorf("a server with a certificate for other names: status %q, want 502", out)
	}
	noTrace(t, w, sb.ID, httpsSecret, httpsRotated)

	// A placeholder: swapped on requests to example.test, sent as is to
	// other.test (over TLS the sandbox holds end to end, and in plain HTTP,
	// where the proxy logs it).
	ph := d.create(t, corral.CreateOptions{Template: "default", Runtime: runtime, Network: &corral.NetworkPolicy{
		AllowDomains: []string{"example.test", "other.test"},
		Placeholders: []corral.PlaceholderRule{{Domain: "example.test", Env: "API_KEY", Secret: name}},
	}})
	if _, err := d.Client.WriteFile(ctx, ph.ID, "/tmp/test-ca.pem", bytes.NewReader(w.in.Certs.CAPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := d.execOut(t, ph.ID, `echo "$API_KEY"; curl -sS -H "Authorization: Bearer $API_KEY" https://example.test/; `+
		`curl -sS --cacert /tmp/test-ca.pem -H "Authorization: Bearer $API_KEY" https://other.test/; `+
		`curl -sS -H "Authorization: Bearer $API_KEY" http://other.test/`)
	lines := strings.Split(out, "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "corral-placeholder-") {
		t.Fatalf("placeholder checks: %q", out)
	}
	holder := lines[0]
	if nettest.Field(lines[1], "server") != "a" || !strings.HasSuffix(lines[1], "auth=Bearer "+httpsRotated) {
		t.Errorf("placeholder to its domain: %q, want the secret", lines[1])
	}
	for _, l := range lines[2:4] {
		if nettest.Field(l, "server") != "b" || !strings.HasSuffix(l, "auth=Bearer "+holder) {
			t.Errorf("placeholder to another host: %q, want it unchanged", l)
		}
	}
	if !strings.Contains(d.Logs(), "egress placeholder sent to a host it is not for") {
		t.Error("the placeholder sent to other.test was not logged")
	}
	noTrace(t, w, ph.ID, httpsSecret, httpsRotated)
	if logs := d.Logs(); strings.Contains(logs, httpsSecret) || strings.Contains(logs, httpsRotated) {
		t.Error("the daemon logged a secret")
	}
}

// noTrace checks that none of values is anywhere inside sandbox id: not
// in the environment of its processes, in a file or in the memory of any
// process it can read. The script assembles each pattern at run time so
// that it does not contain it; a control copy in a file and in the
// scanning process's own memory shows that the searches find it (the
// shell that assembled it is its parent, and not counted).
func noTrace(t *testing.T, w *netWorld, id string, values ...string) {
	t.Helper()
	for _, v := range values {
		half := len(v) / 2
		script := `p=` + v[:half] + `; p=${p}` + v[half:] + `; echo "$p" >/tmp/control; ` +
			`cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c "$p"; ` +
			`find / \( -path /proc -o -path /sys -o -path /dev -o -path /usr \) -prune -o -type f -size -8M -exec grep -l "$p" {} + 2>/dev/null; ` +
			`P="$p" python3 -c '` + memScan + `'`
		out, _ := w.sh(t, id, script)
		if out != "0\n/tmp/control\nself\n" {
			t.Errorf("secret %s...: found inside the sandbox: %q", v[:4], out)
		}
	}
}

// memScan searches the readable memory of every process but its parent
// for $P and prints "self" for its own hit and the PIDs of any other.
const memScan = `
import os, re
p = os.environ["P"].encode()
for pid in sorted(d for d in os.listdir("/proc") if d.isdigit()):
    if int(pid) == os.getppid():
        continue
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", 0)
    except OSError:
        continue
    found = False
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        try:
            mem.seek(start)
            if p in mem.read(end - start):
                found = True
                break
        except (OSError, OverflowError, ValueError):
            continue
    if found:
        print("self" if int(pid) == os.getpid() else pid)
`
