package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/sandbox"
)

// volumeEnv is an env whose facade serves volumes from a fakeVolumes.
func volumeEnv(t *testing.T) (*env, *fakeVolumes) {
	t.Helper()
	e := newEnv(t)
	vols := newFakeVolumes(t.TempDir())
	srv, _ := New(Config{Manager: e.m, APIKey: testKey, Volumes: vols})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	ve := *e
	ve.ts, ve.srv = ts, srv
	return &ve, vols
}

// content calls the volume content API with a bearer token ("" for none)
// and returns the status and the body.
func (e *env) content(method, volume, endpoint string, query url.Values, token, body string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.ts.URL+"/volumecontent/"+volume+"/"+endpoint+"?"+query.Encode(), strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPut {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// E2B's /volumes: a volume's ID is its Corral name; create and get answer
// its content token; a name in use, a bad name, a missing volume and a
// volume in use answer E2B's error shape with 409, 400, 404 and 409.
func TestVolumesAPI(t *testing.T) {
	e, vols := volumeEnv(t)
	var created volumeInfo
	if code := e.api("POST", "/volumes", `{"name":"data"}`, &created); code != 201 {
		t.Fatalf("create: %d %+v", code, created)
	}
	if want := (volumeInfo{VolumeID: "data", Name: "data", Token: e.srv.volumeToken("data")}); created != want || created.Token == "" {
		t.Fatalf("create answered %+v, want %+v", created, want)
	}
	if _, err := vols.Volume(t.Context(), "data"); err != nil {
		t.Fatalf("the Corral volume: %v", err)
	}
	for _, tt := range []struct{ name, method, path, body string }{
		{"again", "POST", "/volumes", `{"name":"data"}`},
		{"bad name", "POST", "/volumes", `{"name":"Bad Name"}`},
		{"no name", "POST", "/volumes", `{}`},
		{"get missing", "GET", "/volumes/nope", ""},
		{"destroy missing", "DELETE", "/volumes/nope", ""},
	} {
		var out apiError
		code := e.api(tt.method, tt.path, tt.body, &out)
		if code < 400 || out.Code != code || out.Message == "" {
			t.Errorf("%s: %d %+v", tt.name, code, out)
		}
	}
	var list []map[string]any
	if code := e.api("GET", "/volumes", "", &list); code != 200 {
		t.Fatalf("list: %d", code)
	}
	if diff := cmp.Diff([]map[string]any{{"volumeID": "data", "name": "data"}}, list); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
	var got volumeInfo
	if code := e.api("GET", "/volumes/data", "", &got); code != 200 || got != created {
		t.Fatalf("get: %d %+v", code, got)
	}

	vols.setInUse("data", "sb1")
	var out apiError
	if code := e.api("DELETE", "/volumes/data", "", &out); code != 409 || !strings.Contains(out.Message, "sb1") {
		t.Fatalf("destroy in use: %d %+v", code, out)
	}
	vols.setInUse("data")
	if code := e.api("DELETE", "/volumes/data", "", nil); code != 204 {
		t.Fatalf("destroy: %d", code)
	}
	if code := e.api("GET", "/volumes/data", "", nil); code != 404 {
		t.Fatalf("get after destroy: %d", code)
	}

	req, _ := http.NewRequest("GET", e.ts.URL+"/volumes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("list without API key: %d", resp.StatusCode)
	}
}

// The volume content API reads and writes a volume's files with its token.
func TestVolumeContent(t *testing.T) {
	e, vols := volumeEnv(t)
	if _, err := vols.CreateVolume(t.Context(), VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	tok := e.srv.volumeToken("data")
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	entry := func(body string) volumeEntry {
		t.Helper()
		var ve volumeEntry
		if err := json.Unmarshal([]byte(body), &ve); err != nil {
			t.Fatalf("entry %q: %v", body, err)
		}
		return ve
	}

	code, body := e.content("PUT", "data", "file", q("path", "/in/hello.txt", "mode", "384"), tok, "hello volume")
	if ve := entry(body); code != 200 || ve.Type != "file" || ve.Path != "/in/hello.txt" || ve.Size != 12 || ve.Mode != 0o600 || ve.Mtime.IsZero() {
		t.Fatalf("write: %d %s", code, body)
	}
	if code, body := e.content("GET", "data", "file", q("path", "in/hello.txt"), tok, ""); code != 200 || body != "hello volume" {
		t.Fatalf("read: %d %q", code, body)
	}
	if code, body := e.content("GET", "data", "path", q("path", "/in"), tok, ""); code != 200 || entry(body).Type != "directory" {
		t.Fatalf("stat: %d %s", code, body)
	}
	if code, body := e.content("POST", "data", "dir", q("path", "/a/b"), tok, ""); code != 404 {
		t.Fatalf("mkdir without parents: %d %s", code, body)
	}
	if code, body := e.content("POST", "data", "dir", q("path", "/a/b", "force", "true"), tok, ""); code != 201 || entry(body).Name != "b" {
		t.Fatalf("mkdir with parents: %d %s", code, body)
	}
	if code, body := e.content("POST", "data", "dir", q("path", "/a/b"), tok, ""); code != 409 {
		t.Fatalf("mkdir of an existing directory: %d %s", code, body)
	}
	for _, tt := range []struct {
		depth string
		want  []string
	}{
		{"", []string{"/a", "/in"}},
		{"2", []string{"/a", "/a/b", "/in", "/in/hello.txt"}},
	} {
		code, body := e.content("GET", "data", "dir", q("path", "/", "depth", tt.depth), tok, "")
		var ents []volumeEntry
		_ = json.Unmarshal([]byte(body), &ents)
		var got []string
		for _, ve := range ents {
			got = append(got, ve.Path)
		}
		if diff := cmp.Diff(tt.want, got); code != 200 || diff != "" {
			t.Errorf("list depth %q: %d (-want +got):\n%s", tt.depth, code, diff)
		}
	}
	if code, _ := e.content("DELETE", "data", "path", q("path", "/in"), tok, ""); code != 204 {
		t.Fatalf("remove: %d", code)
	}
	if code, _ := e.content("GET", "data", "file", q("path", "/in/hello.txt"), tok, ""); code != 404 {
		t.Fatalf("read of a removed file: %d", code)
	}
	if code, _ := e.content("GET", "data", "file", q("path", "/in/hello.txt"), testKey, ""); code != 404 {
		t.Fatalf("the API key is accepted too: %d", code)
	}
}

// Bad volume content requests answer the API's error shape, whose code is
// the status as a string.
func TestVolumeContentErrors(t *testing.T) {
	e, vols := volumeEnv(t)
	for _, n := range []string{"data", "other"} {
		if _, err := vols.CreateVolume(t.Context(), VolumeOptions{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	tok := e.srv.volumeToken("data")
	for _, tt := range []struct {
		name, method, volume, endpoint, query, token string
		code                                         int
	}{
		{"no token", "GET", "data", "path", "path=/", "", 401},
		{"another volume's token", "GET", "other", "path", "path=/", tok, 401},
		{"missing volume", "GET", "nope", "path", "path=/", e.srv.volumeToken("nope"), 404},
		{"missing path", "GET", "data", "path", "path=/nope", tok, 404},
		{"remove missing", "DELETE", "data", "path", "path=/nope", tok, 404},
		{"remove root", "DELETE", "data", "path", "path=/", tok, 400},
		{"owner", "PUT", "data", "file", "path=/f&uid=1000", tok, 400},
		{"mode", "PUT", "data", "file", "path=/f&mode=99999", tok, 400},
		{"write root", "PUT", "data", "file", "path=/", tok, 400},
		{"depth", "GET", "data", "dir", "path=/&depth=0", tok, 400},
		{"metadata", "PATCH", "data", "path", "path=/", tok, 501},
		{"unknown route", "GET", "data", "nope", "", tok, 404},
	} {
		q, _ := url.ParseQuery(tt.query)
		code, body := e.content(tt.method, tt.volume, tt.endpoint, q, tt.token, "x")
		var out struct{ Code, Message string }
		if err := json.Unmarshal([]byte(body), &out); err != nil || code != tt.code || out.Code != strconv.Itoa(tt.code) || out.Message == "" {
			t.Errorf("%s: %d %s, want %d", tt.name, code, body, tt.code)
		}
	}
}

// A Server without volumes answers 501 to the volume APIs and refuses
// volumeMounts, naming the reason.
func TestNoVolumes(t *testing.T) {
	e := newEnv(t)
	e.srv.vols = nil // as for a Manager without the volume API
	var out apiError
	if code := e.api("GET", "/volumes", "", &out); code != 501 || !strings.Contains(out.Message, "volumes") {
		t.Errorf("list: %d %+v", code, out)
	}
	if code := e.api("POST", "/v2/sandboxes", `{"templateID":"bb","volumeMounts":[{"name":"data","path":"/data"}]}`, &out); code != 400 || !strings.Contains(out.Message, "volumeMounts") {
		t.Errorf("create with volumeMounts: %d %+v", code, out)
	}
	if code, body := e.content("GET", "data", "path", url.Values{"path": {"/"}}, testKey, ""); code != 501 {
		t.Errorf("volume content: %d %s", code, body)
	}
}

// volumeMounts become read-write volume mounts of the sandbox; the
// sandbox's volume mounts, and only those, are its info's volumeMounts.
func TestVolumeMounts(t *testing.T) {
	n := newSandbox{TemplateID: "bb", VolumeMounts: []volumeMountInfo{{Name: "data", Path: "/data"}, {Name: "cache", Path: "/root/.cache"}}}
	got, err := n.mounts(true)
	if err != nil {
		t.Fatal(err)
	}
	want := []sandbox.Mount{volumeMount("data", "/data"), volumeMount("cache", "/root/.cache")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if got[0].Mode != sandbox.MountReadWrite || mountedVolume(got[0]) != "data" {
		t.Errorf("mount %+v: want volume data, read-write", got[0])
	}
	for _, bad := range [][]volumeMountInfo{{{Name: "data"}}, {{Path: "/data"}}} {
		if _, err := (newSandbox{VolumeMounts: bad}).mounts(true); err == nil {
			t.Errorf("mounts %+v: no error", bad)
		}
	}
	if ms, err := (newSandbox{}).mounts(false); err != nil || ms != nil {
		t.Errorf("no volumeMounts: %v %v", ms, err)
	}

	srv, _ := New(Config{APIKey: testKey})
	sb := sandbox.Sandbox{ID: "sb1", State: sandbox.StateRunning,
		Mounts: []sandbox.Mount{volumeMount("data", "/data"), {Source: "/srv/repo", Target: "/repo", Mode: sandbox.MountCopyOnWrite}}}
	info := srv.info(sb, true, true)
	if diff := cmp.Diff([]volumeMountInfo{{Name: "data", Path: "/data"}}, info.VolumeMounts); diff != "" {
		t.Errorf("info volumeMounts (-want +got):\n%s", diff)
	}
	b, _ := json.Marshal(srv.info(sandbox.Sandbox{ID: "sb2", State: sandbox.StateRunning}, false, true))
	if !strings.Contains(string(b), `"volumeMounts":[]`) {
		t.Errorf("a sandbox without volumes: %s, want an empty volumeMounts", b)
	}
}
