package e2e

import (
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestPorts forwards HTTP and a WebSocket through the daemon to servers in
// real sandboxes, on runc (dialed inside the sandbox's namespace) and
// gVisor (through the agent), with and without a network, servers bound
// to loopback included; a closed port and an unknown sandbox are clear
// errors. Over TCP the API key is required and not passed on to the
// sandbox; the E2B facade's host routing reaches the same ports.
func TestPorts(t *testing.T) {
	requireHost(t)
	addr, e2bAddr := testutil.FreeLoopbackAddr(t), testutil.FreeLoopbackAddr(t)
	extra := []string{"--listen", addr, "--api-key", "portkey", "--e2b-listen", e2bAddr}
	if _, err := exec.LookPath("runsc"); err == nil {
		extra = append(extra, "--runtimes", "gvisor")
	}
	d := startDaemon(t, "overlay", extra...)
	tcp, err := corral.New("http://"+addr, "portkey")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()

	for _, tt := range []struct {
		runtime, mode string
	}{
		{"runc", "none"},
		{"runc", "allowlist"},
		{"gvisor", "none"},
		{"gvisor", "allowlist"},
	} {
		t.Run(tt.runtime+"/"+tt.mode, func(t *testing.T) {
			if tt.runtime == "gvisor" {
				testutil.RequiresBinary(t, "runsc")
			}
			sb := d.create(t, corral.CreateOptions{Runtime: tt.runtime, Network: &corral.NetworkPolicy{Mode: tt.mode}})
			d.installNettool(t, sb.ID)
			if _, err := d.Client.StartProcess(t.Context(), sb.ID, corral.StartOptions{Cmd: []string{nettoolPath, "serve", "8000"}}); err != nil {
				t.Fatal(err)
			}
			// busybox httpd bound to loopback only.
			if _, err := d.Client.StartProcess(t.Context(), sb.ID, corral.StartOptions{
				Shell: "mkdir -p /work/www && echo loopback-page > /work/www/index.html && exec httpd -f -p 127.0.0.1:8001 -h /work/www",
			}); err != nil {
				t.Fatal(err)
			}
			get := func(c *corral.Client, port int, path string, hdr ...string) (int, string, error) {
				req, err := http.NewRequestWithContext(t.Context(), "GET", c.PortURL(sb.ID, port)+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i+1 < len(hdr); i += 2 {
					req.Header.Set(hdr[i], hdr[i+1])
				}
				resp, err := c.PortClient().Do(req)
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b), err
			}
			// The servers start in the background: wait for each to listen.
			waitListening := func(port int, path string, hdr ...string) (int, string) {
				for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
					status, body, err := get(d.Client, port, path, hdr...)
					if err != nil {
						t.Fatal(err)
					}
					if status != http.StatusServiceUnavailable || time.Since(start) > 10*time.Second {
						return status, body
					}
				}
			}
			status, body := waitListening(8000, "hello%20there?x=1", "Authorization", "mine")
			if want := "sandbox server: GET /hello%20there?x=1 host=localhost:8000 auth=mine\n"; status != 200 || body != want {
				t.Fatalf("GET: %d %q; want 200 %q", status, body, want)
			}

			// WebSocket echo, over the TCP listener with the key.
			ctx := t.Context()
			wsURL := "ws" + strings.TrimPrefix(tcp.PortURL(sb.ID, 8000), "http") + "ws"
			conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: tcp.PortClient()})
			if err != nil {
				t.Fatalf("websocket dial %s: %v", wsURL, err)
			}
			defer conn.CloseNow()
			for _, msg := range []string{"one", "two"} {
				if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					t.Fatal(err)
				}
				_, got, err := conn.Read(ctx)
				if err != nil || string(got) != "echo: "+msg {
					t.Fatalf("websocket read: %q %v", got, err)
				}
			}
			conn.Close(websocket.StatusNormalClosure, "")

			// The key authenticates at the daemon and goes no further.
			if status, body, err := get(tcp, 8000, ""); err != nil || status != 200 || !strings.Contains(body, "auth=\n") {
				t.Errorf("GET over TCP: %d %q %v; want the key removed", status, body, err)
			}
			noKey, err := corral.New("http://"+addr, "")
			if err != nil {
				t.Fatal(err)
			}
			defer noKey.Close()
			if status, body, err := get(noKey, 8000, ""); err != nil || status != 401 || strings.Contains(body, "sandbox server") {
				t.Errorf("GET over TCP without the key: %d %q %v; want 401", status, body, err)
			}
			// The scheme is matched regardless of case (RFC 9110 §11.1).
			if status, body, err := get(noKey, 8000, "", "Authorization", "bearer portkey"); err != nil || status != 200 || !strings.Contains(body, "auth=\n") {
				t.Errorf("GET over TCP with a lower-case bearer scheme: %d %q %v; want 200 and the key removed", status, body, err)
			}

			// A server bound to loopback only.
			if status, body := waitListening(8001, ""); status != 200 || body != "loopback-page\n" {
				t.Errorf("loopback server: %d %q", status, body)
			}
			// A closed port.
			if status, body, err := get(d.Client, 8009, ""); err != nil || status != 503 || !strings.Contains(body, "nothing listens on port 8009") {
				t.Errorf("closed port: %d %q %v", status, body, err)
			}

			// The E2B facade routes <port>-<id>.<domain> hosts to the port,
			// with a credential.
			for _, cred := range []struct{ header, value string }{{"X-API-Key", "portkey"}, {"Authorization", "bearer portkey"}, {}} {
				key := cred.value
				req, err := http.NewRequestWithContext(ctx, "GET", "http://"+e2bAddr+"/via-e2b", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Host = "8000-" + sb.ID + ".e2b.test"
				if key != "" {
					req.Header.Set(cred.header, key)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if key != "" && (resp.StatusCode != 200 || !strings.Contains(string(b), "GET /via-e2b host=localhost:8000 auth=\n")) {
					t.Errorf("E2B host routing with %s: %d %q", cred.header, resp.StatusCode, b)
				}
				if key == "" && resp.StatusCode != 401 {
					t.Errorf("E2B host routing without a credential: %d %q; want 401", resp.StatusCode, b)
				}
			}

			// The CLI prints the URL; curl fetches it over the socket.
			out, errOut, code := d.corral("port", sb.ID, "8000")
			u := strings.TrimSpace(out)
			if code != 0 || !strings.HasSuffix(u, "/v1/sandboxes/"+sb.ID+"/ports/8000/") || !strings.Contains(errOut, "--unix-socket") {
				t.Fatalf("corral port: %d %q %q", code, out, errOut)
			}
			if _, err := exec.LookPath("curl"); err == nil {
				b, err := exec.Command("curl", "-sS", "--unix-socket", d.Socket, u+"via-curl").CombinedOutput()
				if err != nil || !strings.Contains(string(b), "GET /via-curl") {
					t.Errorf("curl %s: %v %q", u, err, b)
				}
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		for _, tt := range []struct {
			path string
			want int
		}{
			{"/v1/sandboxes/nosuchsandbox/ports/8000/", 404},
			{"/v1/sandboxes/nosuchsandbox/ports/0/", 400},
			{"/v1/sandboxes/nosuchsandbox/ports/http/", 400},
		} {
			resp, err := d.Client.PortClient().Get("http://corral" + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want || !strings.Contains(string(b), `"code"`) {
				t.Errorf("%s: %d %q; want %d with an error body", tt.path, resp.StatusCode, b, tt.want)
			}
		}
		if _, _, code := d.corral("port", "nosuchsandbox", "8000"); code == 0 {
			t.Error("corral port of an unknown sandbox succeeded")
		}
	})
}

// BenchmarkPortRoundTrip measures a GET forwarded by the daemon to a
// server in a sandbox (SDK PortClient over the unix socket, the daemon's
// reverse proxy with kept-alive connections, then runc's namespace dial or
// gVisor's agent): the p50 and p99 per runtime.
//
//	go test -run '^$' -bench PortRoundTrip -benchtime 500x ./test/e2e
func BenchmarkPortRoundTrip(b *testing.B) {
	d := startDaemon(b, "overlay", "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		b.Run(rt, func(b *testing.B) {
			sb := d.create(b, corral.CreateOptions{Runtime: rt})
			d.installNettool(b, sb.ID)
			if _, err := d.Client.StartProcess(b.Context(), sb.ID, corral.StartOptions{Cmd: []string{nettoolPath, "serve", "8000"}}); err != nil {
				b.Fatal(err)
			}
			hc, u := d.Client.PortClient(), d.Client.PortURL(sb.ID, 8000)
			get := func() error {
				resp, err := hc.Get(u)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				_, err = io.Copy(io.Discard, resp.Body)
				if err == nil && resp.StatusCode != 200 {
					err = errors.New(resp.Status)
				}
				return err
			}
			for start := time.Now(); get() != nil; time.Sleep(50 * time.Millisecond) {
				if time.Since(start) > 10*time.Second {
					b.Fatalf("server in %s never answered: %v", sb.ID, get())
				}
			}
			samples := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				if err := get(); err != nil {
					b.Fatal(err)
				}
				samples = append(samples, time.Since(start))
			}
			reportPercentiles(b, "", samples)
		})
	}
}
