package e2b

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/tenancy"
)

// newTenantEnv makes an env whose facade accepts key records, and a
// key of tenant team-a; the env's sandbox is the admin's.
func newTenantEnv(t *testing.T, opts ...func(*sandbox.Config, *Config)) (e *env, keys *tenancy.Keys, k tenancy.Key, secret string) {
	t.Helper()
	keys, err := tenancy.NewKeys(t.Context(), tenancy.NewMemStore(), testKey)
	if err != nil {
		t.Fatal(err)
	}
	k, secret, err = keys.Create(t.Context(), tenancy.KeyOptions{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, func(_ *sandbox.Config, c *Config) { c.Keys = keys })
	return newEnv(t, opts...), keys, k, secret
}

// createAs creates a sandbox of template bb with key and makes it the
// env's sandbox.
func (e *env) createAs(key string) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.ts.URL+"/v2/sandboxes", strings.NewReader(`{"templateID":"bb"}`))
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var created map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&created)
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("create with key: %d %v", resp.StatusCode, created)
	}
	e.id, e.token = created["sandboxID"].(string), created["envdAccessToken"].(string)
}

// frame is one message of a Connect stream; end marks the end-of-stream
// message.
type frame struct {
	end  bool
	data []byte
}

// openStream starts a server-streaming Connect call with JSON and sends
// its messages to the returned channel, which is closed when the stream
// ends.
func (e *env) openStream(method, body string, hdr map[string]string) <-chan frame {
	e.t.Helper()
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	resp := e.envd("POST", "/"+method, "application/connect+json", bytes.NewReader(append(env, body...)), hdr)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("%s: HTTP %d: %s", method, resp.StatusCode, b)
	}
	out := make(chan frame, 64)
	go func() {
		defer close(out)
		r := bufio.NewReader(resp.Body)
		for {
			var h [5]byte
			if _, err := io.ReadFull(r, h[:]); err != nil {
				return
			}
			data := make([]byte, binary.BigEndian.Uint32(h[1:]))
			if _, err := io.ReadFull(r, data); err != nil {
				return
			}
			out <- frame{end: h[0]&0x02 != 0, data: data}
		}
	}()
	return out
}

// next returns the stream's next message, failing after a while.
func next(t *testing.T, what string, c <-chan frame) (frame, bool) {
	t.Helper()
	select {
	case f, ok := <-c:
		return f, ok
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no message for 10s", what)
		return frame{}, false
	}
}

// TestRevokedKeyEndsStreams opens envd streams and a port proxy with a
// team's API key and with the sandbox's access token, then revokes the
// key: what the key opened ends with "unauthenticated" (the stream) or
// is cut (the proxied response); what the token opened goes on.
func TestRevokedKeyEndsStreams(t *testing.T) {
	e, keys, _, secret := newTenantEnv(t)
	e.createAs(secret)
	ticks := `{"process":{"cmd":"/bin/sh","args":["-c","while :; do echo tick; sleep 0.05; done"]},"stdin":false}`
	byKey := e.openStream("process.Process/Start", ticks, map[string]string{"X-Access-Token": "", "X-API-Key": secret})
	watchByKey := e.openStream("filesystem.Filesystem/WatchDir", `{"path":"/"}`, map[string]string{"X-Access-Token": "", "X-API-Key": secret})
	byToken := e.openStream("process.Process/Start", ticks, nil)
	for name, c := range map[string]<-chan frame{"key": byKey, "watch": watchByKey, "token": byToken} {
		if f, ok := next(t, name, c); !ok || f.end {
			t.Fatalf("stream opened with the %s: %q", name, f.data)
		}
	}

	// A server on the host's loopback: the fake driver's agent reaches
	// the host's ports as its sandbox's.
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for {
			if _, err := io.WriteString(w, "tick\n"); err != nil || rc.Flush() != nil {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(backend.Close) // after the responses are closed (cleanups run last first)
	proxied := func(hdr map[string]string) *bufio.Reader {
		t.Helper()
		_, p, _ := strings.Cut(backend.URL, "127.0.0.1:")
		h := map[string]string{"E2b-Sandbox-Port": p, "X-Access-Token": ""}
		for k, v := range hdr {
			h[k] = v
		}
		resp := e.envd("GET", "/", "", nil, h)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("port proxy: %d %s", resp.StatusCode, b)
		}
		return bufio.NewReader(resp.Body)
	}
	portByKey := proxied(map[string]string{"X-API-Key": secret})
	portByToken := proxied(map[string]string{"E2b-Traffic-Access-Token": e.token})
	for _, r := range []*bufio.Reader{portByKey, portByToken} {
		if l, err := r.ReadString('\n'); err != nil || l != "tick\n" {
			t.Fatalf("proxied response: %q %v", l, err)
		}
	}

	if err := keys.Delete(t.Context(), "team-a"); err != nil {
		t.Fatal(err)
	}
	endsUnauthenticated(t, "the key's process stream", byKey)
	endsUnauthenticated(t, "the key's watch", watchByKey)
	portEnded := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, portByKey)
		portEnded <- err
	}()
	select {
	case <-portEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the key's proxied response is still open")
	}
	// What the token opened outlives the key.
	drain := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case f, ok := <-byToken:
			if !ok || f.end {
				t.Fatalf("the token's stream ended with the key: %s", f.data)
			}
		case <-drain:
			done = true
		}
	}
	for range 3 {
		if l, err := portByToken.ReadString('\n'); err != nil || l != "tick\n" {
			t.Fatalf("the token's proxied response after the revocation: %q %v", l, err)
		}
	}
}

// endsUnauthenticated reads stream c until its end-of-stream message,
// which must come within 10s and say "unauthenticated".
func endsUnauthenticated(t *testing.T, what string, c <-chan frame) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		f, ok := next(t, what, c)
		if time.Now().After(deadline) {
			t.Fatalf("%s is still open", what)
		}
		if !ok {
			t.Fatalf("%s ended without an end-of-stream message", what)
		}
		if f.end {
			var end struct {
				Error struct{ Code string } `json:"error"`
			}
			if err := json.Unmarshal(f.data, &end); err != nil || end.Error.Code != "unauthenticated" {
				t.Errorf("end of %s: %s, want code unauthenticated", what, f.data)
			}
			return
		}
	}
}
