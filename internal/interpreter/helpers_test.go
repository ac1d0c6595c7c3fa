package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
)

// hostTools finds the interpreters on the host: a Python whose ipykernel,
// pandas and matplotlib import (Debian's python3-ipykernel,
// python3-pandas and python3-matplotlib), node and bash. A missing one
// skips the test, or fails it under CORRAL_TEST_REQUIRE=1.
func hostTools(t testing.TB) Tools {
	t.Helper()
	tools := Tools{Node: testutil.RequiresBinary(t, "node"), Bash: testutil.RequiresBinary(t, "bash")}
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import ipykernel, pandas, matplotlib").Run() == nil {
			tools.Python = py
			return tools
		}
	}
	msg := "no python3 with ipykernel, pandas and matplotlib (apt-get install python3-ipykernel python3-pandas python3-matplotlib)"
	if testutil.Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return tools
}

// testServer is a Server on the host's interpreters behind an HTTP test
// server; both stop when the test ends, and the test fails if a kernel
// process outlives them.
type testServer struct {
	s   *Server
	url string
}

func newTestServer(t *testing.T, mod func(*Options)) *testServer {
	t.Helper()
	opts := Options{Tools: hostTools(t), Dir: t.TempDir(), Cwd: t.TempDir(), Env: os.Environ(), Defaults: []string{LangPython}}
	if mod != nil {
		mod(&opts)
	}
	s := NewServer(opts)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		s.Close()
		if kids := children(t); len(kids) > 0 {
			t.Errorf("kernel processes left after Close: %v", kids)
		}
	})
	<-s.ready
	return &testServer{s: s, url: hs.URL}
}

// children lists the live child processes of the test binary.
func children(t *testing.T) []string {
	t.Helper()
	self := []byte(" " + strconv.Itoa(os.Getpid()) + " ")
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || len(b) < i+4 {
			continue
		}
		if bytes.HasPrefix(b[i+3:], self[1:]) && b[i+2] != 'Z' {
			out = append(out, e.Name()+" "+string(b[:i+1]))
		}
	}
	return out
}

// execution is what one /execute stream said.
type execution struct {
	status  int
	body    string // the body of a refused request
	events  []Event
	stdout  string
	stderr  string
	results []Event
	errs    []Event
	count   int
	end     *Event
}

func (x *execution) main() map[string]any {
	for _, r := range x.results {
		if r.Main {
			return r.Result
		}
	}
	return nil
}

func (ts *testServer) exec(t *testing.T, req ExecuteRequest) *execution {
	t.Helper()
	return ts.execCtx(t.Context(), t, req)
}

func (ts *testServer) execCtx(ctx context.Context, t *testing.T, req ExecuteRequest) *execution {
	t.Helper()
	b, _ := json.Marshal(req)
	hreq, _ := http.NewRequestWithContext(ctx, "POST", ts.url+"/execute", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return &execution{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	x := &execution{status: resp.StatusCode}
	if resp.StatusCode != 200 {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		x.body = buf.String()
		return x
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		if x.end != nil {
			t.Errorf("event after the end: %+v", e)
		}
		x.events = append(x.events, e)
		switch e.Type {
		case EventStdout:
			x.stdout += e.Text
		case EventStderr:
			x.stderr += e.Text
		case EventResult:
			x.results = append(x.results, e)
		case EventError:
			x.errs = append(x.errs, e)
		case EventCount:
			x.count = e.Count
		case EventEnd:
			x.end = &e
		}
	}
	if x.end == nil && ctx.Err() == nil {
		t.Errorf("stream without end_of_execution: %+v", x.events)
	}
	return x
}

// call sends a JSON request to the API and decodes the answer into out.
func (ts *testServer) call(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, ts.url+path, rd)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decoding: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// serve serves s on a loopback port until the benchmark ends.
func serve(b *testing.B, s *Server) string {
	hs := httptest.NewServer(s.Handler())
	b.Cleanup(hs.Close)
	<-s.ready
	return hs.URL
}
