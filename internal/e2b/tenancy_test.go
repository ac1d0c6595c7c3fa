package e2b

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// TestTeamTemplates checks the E2B facade's template routes under the
// tenant rule: a team sees the operator's templates and its own, another
// team's answers 404 as an unknown one, and the operator's cannot be
// deleted by a team.
func TestTeamTemplates(t *testing.T) {
	e, keys, _, secretA := newTenantEnv(t)
	_, secretB, err := keys.Create(t.Context(), tenancy.KeyOptions{Name: "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	asA := tenancy.With(t.Context(), tenancy.Principal{Tenant: "team-a", Key: "team-a"})
	if _, err := e.m.CreateTemplate(asA, "a-tpl", "import", func(dir string) error {
		return os.MkdirAll(filepath.Join(dir, "root"), 0o755)
	}); err != nil {
		t.Fatal(err)
	}
	call := func(key, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, e.ts.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	listed := func(key string) []string {
		t.Helper()
		code, body := call(key, "GET", "/templates", "")
		var list []templateInfo
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil {
			t.Fatalf("list: %d %s", code, body)
		}
		var out []string
		for _, tpl := range list {
			out = append(out, tpl.TemplateID)
		}
		return out
	}
	if diff := cmp.Diff([]string{"a-tpl", "bb"}, listed(secretA)); diff != "" {
		t.Errorf("team-a lists (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"bb"}, listed(secretB)); diff != "" {
		t.Errorf("team-b lists (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		name, key, method, path, body string
		want                          int
	}{
		{"team-b reads a's alias", secretB, "GET", "/templates/aliases/a-tpl", "", http.StatusNotFound},
		{"team-b creates from a's template", secretB, "POST", "/sandboxes", `{"templateID":"a-tpl"}`, http.StatusNotFound},
		{"team-b deletes a's template", secretB, "DELETE", "/templates/a-tpl", "", http.StatusNotFound},
		{"team-a deletes the operator's template", secretA, "DELETE", "/templates/bb", "", http.StatusForbidden},
		{"team-a reads its alias", secretA, "GET", "/templates/aliases/a-tpl", "", http.StatusOK},
		{"team-a deletes its template", secretA, "DELETE", "/templates/a-tpl", "", http.StatusNoContent},
	} {
		if code, body := call(tt.key, tt.method, tt.path, tt.body); code != tt.want {
			t.Errorf("%s: %d %s, want %d", tt.name, code, body, tt.want)
		}
	}
}
