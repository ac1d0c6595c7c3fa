package e2bcompat

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/timestamppb" // registers google/protobuf/timestamp.proto
)

// sdkDescriptors reads the envd protocol definitions (process.proto,
// filesystem.proto) that the installed e2b package embeds as serialized
// file descriptors, so that the binary encoding is checked against the
// SDK's own schema rather than a copy.
func sdkDescriptors(t *testing.T, sdkDir string) *protoregistry.Files {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(sdkDir, "node_modules", "e2b", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	files := new(protoregistry.Files)
	for _, m := range regexp.MustCompile(`fileDesc\)\("([A-Za-z0-9+/=]+)"`).FindAllSubmatch(src, -1) {
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(string(m[1]), "="))
		if err != nil {
			t.Fatalf("decoding an embedded descriptor: %v", err)
		}
		var fdp descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fdp); err != nil {
			t.Fatal(err)
		}
		// The bundle drops the import list (it passes imports as code):
		// restore the imports of well-known types.
		for _, m := range fdp.MessageType {
			for _, f := range m.Field {
				if name, ok := strings.CutPrefix(f.GetTypeName(), "."); ok && strings.HasPrefix(name, "google.protobuf.") {
					d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
					if err == nil && !slices.Contains(fdp.Dependency, d.ParentFile().Path()) {
						fdp.Dependency = append(fdp.Dependency, d.ParentFile().Path())
					}
				}
			}
		}
		fd, err := protodesc.NewFile(&fdp, protoregistry.GlobalFiles)
		if err != nil {
			t.Fatalf("descriptor %s: %v", fdp.GetName(), err)
		}
		if err := files.RegisterFile(fd); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"process/process.proto", "filesystem/filesystem.proto"} {
		if _, err := files.FindFileByPath(name); err != nil {
			t.Fatalf("the SDK does not embed %s: %v", name, err)
		}
	}
	return files
}

// testBinary calls envd methods with Content-Type application/proto and
// application/connect+proto, as E2B's Python SDK does, and decodes the
// answers with the SDK's descriptors.
func testBinary(t *testing.T, h *harness) {
	files := sdkDescriptors(t, h.sdkDir)
	msg := func(name string, jsonText string) *dynamicpb.Message {
		t.Helper()
		d, err := files.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatal(err)
		}
		m := dynamicpb.NewMessage(d.(protoreflect.MessageDescriptor))
		if jsonText != "" {
			if err := protojson.Unmarshal([]byte(jsonText), m); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		return m
	}
	// asJSON is the canonical JSON of m, compacted (protojson varies
	// its whitespace on purpose).
	asJSON := func(m proto.Message) string {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_ = json.Compact(&buf, b)
		return buf.String()
	}

	// A sandbox, through the control plane.
	var created struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	h.api(t, "POST", "/sandboxes", `{"templateID":"base","timeout":120}`, &created)
	post := func(method, contentType string, body []byte) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", h.url+"/"+method, bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Connect-Protocol-Version", "1")
		req.Header.Set("E2b-Sandbox-Id", created.SandboxID)
		req.Header.Set("X-Access-Token", created.EnvdAccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	unary := func(method, in, out, reqJSON string) (*http.Response, *dynamicpb.Message) {
		t.Helper()
		body, err := proto.Marshal(msg(in, reqJSON))
		if err != nil {
			t.Fatal(err)
		}
		resp := post(method, "application/proto", body)
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return resp, nil
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/proto" {
			t.Fatalf("%s: content type %q", method, ct)
		}
		m := msg(out, "")
		if err := proto.Unmarshal(data, m); err != nil {
			t.Fatalf("%s: decoding the answer: %v", method, err)
		}
		return resp, m
	}

	if _, m := unary("filesystem.Filesystem/MakeDir", "filesystem.MakeDirRequest", "filesystem.MakeDirResponse", `{"path":"/bin-test/dir"}`); m == nil ||
		!strings.Contains(asJSON(m), `"type":"FILE_TYPE_DIRECTORY"`) || !strings.Contains(asJSON(m), `"path":"/bin-test/dir"`) {
		t.Fatalf("MakeDir: %v", m)
	}
	_, m := unary("filesystem.Filesystem/ListDir", "filesystem.ListDirRequest", "filesystem.ListDirResponse", `{"path":"/bin-test","depth":1}`)
	if m == nil || !strings.Contains(asJSON(m), `"name":"dir"`) || !strings.Contains(asJSON(m), `"modifiedTime":`) {
		t.Fatalf("ListDir: %v", m)
	}
	_, m = unary("filesystem.Filesystem/Stat", "filesystem.StatRequest", "filesystem.StatResponse", `{"path":"/bin/busybox"}`)
	if m == nil || !strings.Contains(asJSON(m), `"size":"`) || !strings.Contains(asJSON(m), `"permissions":"-rwx`) {
		t.Fatalf("Stat: %v", m)
	}
	resp, _ := unary("filesystem.Filesystem/Stat", "filesystem.StatRequest", "filesystem.StatResponse", `{"path":"/bin-test/none"}`)
	if resp.StatusCode != 404 {
		t.Errorf("Stat of a missing file: HTTP %d, want 404", resp.StatusCode)
	}

	// Move and Remove; a malformed message is refused.
	if _, m := unary("filesystem.Filesystem/Move", "filesystem.MoveRequest", "filesystem.MoveResponse",
		`{"source":"/bin-test/dir","destination":"/bin-test/moved"}`); m == nil || !strings.Contains(asJSON(m), `"path":"/bin-test/moved"`) {
		t.Fatalf("Move: %v", m)
	}
	if resp, _ := unary("filesystem.Filesystem/Remove", "filesystem.RemoveRequest", "filesystem.RemoveResponse", `{"path":"/bin-test/moved"}`); resp.StatusCode != 200 {
		t.Fatalf("Remove: HTTP %d", resp.StatusCode)
	}
	if resp, _ := unary("filesystem.Filesystem/Stat", "filesystem.StatRequest", "filesystem.StatResponse", `{"path":"/bin-test/moved"}`); resp.StatusCode != 404 {
		t.Errorf("Stat after Remove: HTTP %d, want 404", resp.StatusCode)
	}
	resp = post("filesystem.Filesystem/Stat", "application/proto", []byte{0x0a, 0x07, '/'}) // path: 7 bytes announced, 1 sent
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_argument"`) {
		t.Errorf("truncated message: HTTP %d %s", resp.StatusCode, b)
	}

	// start runs a server stream of Start and returns its messages as
	// JSON, its stdout, and its end-of-stream message.
	startStream := func(reqJSON string) *http.Response {
		t.Helper()
		body, err := proto.Marshal(msg("process.StartRequest", reqJSON))
		if err != nil {
			t.Fatal(err)
		}
		env := make([]byte, 5)
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		return post("process.Process/Start", "application/connect+proto", append(env, body...))
	}
	start := func(reqJSON string) (events []string, stdout string, end map[string]any) {
		t.Helper()
		resp := startStream(reqJSON)
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/connect+proto" {
			t.Fatalf("Start: HTTP %d %q", resp.StatusCode, ct)
		}
		for {
			var hdr [5]byte
			if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
				t.Fatalf("Start: stream ended without end-of-stream message: %v (events %v)", err, events)
			}
			data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
			if _, err := io.ReadFull(resp.Body, data); err != nil {
				t.Fatal(err)
			}
			if hdr[0]&2 != 0 {
				if err := json.Unmarshal(data, &end); err != nil {
					t.Fatalf("end-of-stream message %q: %v", data, err)
				}
				return events, stdout, end
			}
			m := msg("process.StartResponse", "")
			if err := proto.Unmarshal(data, m); err != nil {
				t.Fatalf("Start: decoding a message: %v", err)
			}
			events = append(events, asJSON(m))
			var ev struct {
				Event struct {
					Data struct {
						Stdout []byte `json:"stdout"`
					} `json:"data"`
				} `json:"event"`
			}
			if err := json.Unmarshal([]byte(events[len(events)-1]), &ev); err != nil {
				t.Fatal(err)
			}
			stdout += string(ev.Event.Data.Stdout)
		}
	}

	// The exit code is a sint32.
	events, _, end := start(`{"process":{"cmd":"/bin/sh","args":["-c","echo bin; echo err >&2; exit 4"]}}`)
	got := strings.Join(events, "\n")
	if len(end) != 0 || len(events) < 4 || !strings.Contains(events[0], `"start":{"pid":`) ||
		!strings.Contains(got, `"stdout":"`+base64.StdEncoding.EncodeToString([]byte("bin\n"))+`"`) ||
		!strings.Contains(got, `"stderr":"`+base64.StdEncoding.EncodeToString([]byte("err\n"))+`"`) ||
		!strings.Contains(events[len(events)-1], `"end":{"exitCode":4,"exited":true,"status":"exit status 4","error":"exit status 4"}`) {
		t.Fatalf("Start events:\n%s\nend %v", got, end)
	}
	// Environment (a map) and working directory (optional).
	events, stdout, end := start(`{"process":{"cmd":"/bin/sh","args":["-c","echo $A-$B; pwd"],"envs":{"A":"one","B":"two"},"cwd":"/bin-test"}}`)
	if len(end) != 0 || stdout != "one-two\n/bin-test\n" {
		t.Fatalf("Start with envs and cwd: stdout %q, end %v, events:\n%s", stdout, end, strings.Join(events, "\n"))
	}
	// A tag names the running process in List. The stream's headers
	// come with its start event, so the process runs once post returns.
	if resp := startStream(`{"process":{"cmd":"/bin/sleep","args":["30"]},"tag":"bin-tag"}`); resp.StatusCode != 200 {
		t.Fatalf("Start with a tag: HTTP %d", resp.StatusCode)
	}
	if _, m := unary("process.Process/List", "process.ListRequest", "process.ListResponse", `{}`); m == nil ||
		!strings.Contains(asJSON(m), `"tag":"bin-tag"`) || !strings.Contains(asJSON(m), `"cmd":"/bin/sleep"`) {
		t.Fatalf("List after a tagged Start: %v", m)
	}
}

// api calls the control plane with the API key.
func (h *harness) api(t *testing.T, method, path, body string, out any) {
	t.Helper()
	req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", h.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
}
