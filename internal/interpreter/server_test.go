package interpreter

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestPython(t *testing.T) {
	ts := newTestServer(t, nil)
	x := ts.exec(t, ExecuteRequest{Code: "x = 20\nprint('hello')\nx + 22"})
	if x.stdout != "hello\n" || x.main()["text"] != "42" || x.count != 1 || len(x.errs) != 0 {
		t.Fatalf("first execution: %+v", x)
	}
	// The context keeps its variables, and counts.
	if x := ts.exec(t, ExecuteRequest{Code: "x * 2"}); x.main()["text"] != "40" || x.count != 2 {
		t.Fatalf("second execution: %+v", x)
	}
	// A string's repr loses its quotes.
	if x := ts.exec(t, ExecuteRequest{Code: "'abc'"}); x.main()["text"] != "abc" {
		t.Errorf("string result: %+v", x.main())
	}
	x = ts.exec(t, ExecuteRequest{Code: "import sys\nprint('warn', file=sys.stderr)\n1/0"})
	if x.stderr != "warn\n" || len(x.errs) != 1 || x.errs[0].Name != "ZeroDivisionError" || x.errs[0].Value != "division by zero" {
		t.Fatalf("error: %+v", x)
	}
	if tb := x.errs[0].Traceback; !strings.Contains(tb, "1/0") || strings.Contains(tb, "\x1b[") {
		t.Errorf("traceback should show the line, without colours: %q", tb)
	}
}

func TestPythonRichResults(t *testing.T) {
	ts := newTestServer(t, nil)
	x := ts.exec(t, ExecuteRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
	r := x.main()
	if diff := cmp.Diff(map[string]any{"a": []any{1.0, 2.0}, "b": []any{"x", "y"}}, r["data"]); diff != "" {
		t.Errorf("data frame data (-want +got):\n%s", diff)
	}
	if html, _ := r["html"].(string); !strings.Contains(html, "<table") {
		t.Errorf("data frame html: %q", html)
	}
	x = ts.exec(t, ExecuteRequest{Code: "from IPython.display import display, HTML, Markdown, JSON\n" +
		"display(HTML('<b>b</b>'))\ndisplay(Markdown('# m'))\ndisplay({'application/json': {'k': 1}, 'text/plain': 'j'}, raw=True)\n" +
		"display({'application/x-custom': 'c', 'text/plain': 'c'}, raw=True)"})
	if len(x.results) != 4 || x.results[0].Result["html"] != "<b>b</b>" || x.results[1].Result["markdown"] != "# m" ||
		cmp.Diff(map[string]any{"k": 1.0}, x.results[2].Result["json"]) != "" || x.results[0].Main {
		t.Fatalf("displays: %+v", x.results)
	}
	if extra, _ := x.results[3].Result["extra"].(map[string]any); extra["application/x-custom"] != "c" {
		t.Errorf("extra: %+v", x.results[3].Result)
	}
}

func TestPythonCharts(t *testing.T) {
	ts := newTestServer(t, nil)
	cases := []struct {
		name, code string
		want       map[string]any // fields of the chart to compare
	}{
		{"line", "plt.plot([1, 2, 3], [4, 5, 6], label='up')\nplt.title('Rise')\nplt.xlabel('t')\nplt.show()",
			map[string]any{"type": "line", "title": "Rise", "x_label": "t",
				"elements": []any{map[string]any{"label": "up", "points": []any{[]any{1.0, 4.0}, []any{2.0, 5.0}, []any{3.0, 6.0}}}}}},
		{"bar", "plt.bar(['a', 'b'], [3, 4])\nplt.show()",
			map[string]any{"type": "bar", "elements": []any{
				map[string]any{"label": "a", "group": "", "value": 3.0}, map[string]any{"label": "b", "group": "", "value": 4.0}}}},
		{"pie", "plt.pie([1, 3], labels=['x', 'y'])\nplt.show()",
			map[string]any{"type": "pie", "elements": []any{
				map[string]any{"label": "x", "angle": 90.0, "radius": 1.0}, map[string]any{"label": "y", "angle": 270.0, "radius": 1.0}}}},
		{"scatter", "plt.scatter([1, 2], [3, 4], label='s')\nplt.show()",
			map[string]any{"type": "scatter", "elements": []any{map[string]any{"label": "s", "points": []any{[]any{1.0, 3.0}, []any{2.0, 4.0}}}}}},
	}
	ts.exec(t, ExecuteRequest{Code: "import matplotlib.pyplot as plt"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := ts.exec(t, ExecuteRequest{Code: c.code})
			if len(x.results) != 1 || len(x.errs) != 0 {
				t.Fatalf("want one display: %+v", x)
			}
			r := x.results[0].Result
			png, _ := base64.StdEncoding.DecodeString(r["png"].(string))
			if !strings.HasPrefix(string(png), "\x89PNG") {
				t.Errorf("png field is not a PNG image")
			}
			chart, _ := r["chart"].(map[string]any)
			got := map[string]any{}
			for k := range c.want {
				if v, ok := chart[k]; ok {
					got[k] = v
				}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("chart (-want +got):\n%s", diff)
			}
		})
	}
	// SVG when asked for, as in any Jupyter kernel.
	x := ts.exec(t, ExecuteRequest{Code: "%config InlineBackend.figure_formats = ['png', 'svg']\nplt.plot([1, 2])\nplt.show()"})
	if len(x.results) != 1 || !strings.Contains(x.results[0].Result["svg"].(string), "<svg") {
		t.Errorf("svg: %+v", x)
	}
}

func TestJavaScriptAndBash(t *testing.T) {
	ts := newTestServer(t, nil)
	x := ts.exec(t, ExecuteRequest{Language: "javascript", Code: "const os = require('os');\nvar n = 6;\nconsole.log('js');\nconsole.error('e');\nn * 7"})
	if x.stdout != "js\n" || x.stderr != "e\n" || x.main()["text"] != "42" || x.count != 1 {
		t.Fatalf("javascript: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{Language: "js", Code: "({n, sum: n + 1})"}); cmp.Diff(map[string]any{"n": 6.0, "sum": 7.0}, x.main()["json"]) != "" {
		t.Errorf("javascript object: %+v", x.main())
	}
	if x := ts.exec(t, ExecuteRequest{Language: "javascript", Code: "await new Promise(r => setTimeout(() => r(5), 10))"}); x.main()["text"] != "5" {
		t.Errorf("top-level await: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{Language: "javascript", Code: "null.x"}); len(x.errs) != 1 || x.errs[0].Name != "TypeError" {
		t.Errorf("javascript error: %+v", x)
	}
	x = ts.exec(t, ExecuteRequest{Language: "bash", Code: "X=4\necho out\necho err >&2\ncd /"})
	if x.stdout != "out\n" || x.stderr != "err\n" || len(x.errs) != 0 {
		t.Fatalf("bash: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "echo $X $PWD\nfalse"}); x.stdout != "4 /\n" || len(x.errs) != 1 || x.errs[0].Value != "1" {
		t.Errorf("bash state and status: %+v", x)
	}
	// A cell cannot read the kernel's own input.
	if x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "read line; echo \"read:$line\""}); x.stdout != "read:\n" {
		t.Errorf("bash stdin: %+v", x)
	}
	// Output without a final newline, and a mark-like prefix, stay whole.
	if x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "printf 'a\\036b'"}); x.stdout != "a\x1eb" {
		t.Errorf("bash partial line: %q", x.stdout)
	}
}

func TestEnvVars(t *testing.T) {
	ts := newTestServer(t, nil)
	for _, c := range []struct{ lang, read string }{
		{"python", "import os; print(os.environ.get('CORRAL_T', 'unset'))"},
		{"javascript", "console.log(process.env.CORRAL_T ?? 'unset')"},
		{"bash", "echo ${CORRAL_T-unset}"},
	} {
		t.Run(c.lang, func(t *testing.T) {
			if x := ts.exec(t, ExecuteRequest{Language: c.lang, Code: c.read, Env: map[string]string{"CORRAL_T": "it's $set"}}); x.stdout != "it's $set\n" {
				t.Errorf("with env_vars: %+v", x)
			}
			if x := ts.exec(t, ExecuteRequest{Language: c.lang, Code: c.read}); x.stdout != "unset\n" {
				t.Errorf("after: %+v", x)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	ts := newTestServer(t, nil)
	for _, c := range []struct {
		name   string
		req    ExecuteRequest
		status int
		code   string
	}{
		{"context and language", ExecuteRequest{Code: "1", ContextID: "x", Language: "python"}, 400, "invalid_argument"},
		{"unknown context", ExecuteRequest{Code: "1", ContextID: "nope"}, 404, "not_found"},
		{"unknown language", ExecuteRequest{Code: "1", Language: "cobol"}, 400, "invalid_argument"},
		{"bad env name", ExecuteRequest{Code: "1", Env: map[string]string{"A;B": "1"}}, 400, "invalid_argument"},
		{"negative timeout", ExecuteRequest{Code: "1", TimeoutMS: -1}, 400, "invalid_argument"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := ts.exec(t, c.req)
			if x.status != c.status || !strings.Contains(x.body, `"code":"`+c.code+`"`) {
				t.Errorf("status %d body %s, want %d %s", x.status, x.body, c.status, c.code)
			}
		})
	}
	if st := ts.call(t, "POST", "/contexts", ContextRequest{Language: "r"}, nil); st != 400 {
		t.Errorf("context for an unknown language: %d", st)
	}
	if st := ts.call(t, "POST", "/contexts", ContextRequest{Cwd: "/nonexistent"}, nil); st != 400 {
		t.Errorf("context in a missing directory: %d", st)
	}
	if st := ts.call(t, "DELETE", "/contexts/nope", nil, nil); st != 404 {
		t.Errorf("deleting an unknown context: %d", st)
	}
	if st := ts.call(t, "POST", "/contexts/nope/restart", nil, nil); st != 404 {
		t.Errorf("restarting an unknown context: %d", st)
	}
}

func TestContexts(t *testing.T) {
	ts := newTestServer(t, nil)
	dir := t.TempDir()
	var c ContextInfo
	if st := ts.call(t, "POST", "/contexts", ContextRequest{Language: "python", Cwd: dir}, &c); st != 200 || c.Cwd != dir || c.Language != "python" {
		t.Fatalf("create: %d %+v", st, c)
	}
	// Contexts do not share variables, and each has its directory.
	ts.exec(t, ExecuteRequest{ContextID: c.ID, Code: "v = 'mine'"})
	if x := ts.exec(t, ExecuteRequest{Code: "'v' in globals()"}); x.main()["text"] != "False" {
		t.Errorf("default context sees another's variable: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{ContextID: c.ID, Code: "import os; os.getcwd()"}); x.main()["text"] != dir {
		t.Errorf("cwd: %+v", x.main())
	}
	var list []ContextInfo
	ts.call(t, "GET", "/contexts", nil, &list)
	if len(list) != 2 {
		t.Errorf("list: %+v", list)
	}
	if st := ts.call(t, "POST", "/contexts/"+c.ID+"/restart", nil, nil); st != 200 {
		t.Fatalf("restart: %d", st)
	}
	if x := ts.exec(t, ExecuteRequest{ContextID: c.ID, Code: "'v' in globals()"}); x.main()["text"] != "False" || x.count != 1 {
		t.Errorf("a restarted context starts afresh: %+v", x)
	}
	if st := ts.call(t, "DELETE", "/contexts/"+c.ID, nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	if x := ts.exec(t, ExecuteRequest{ContextID: c.ID, Code: "1"}); x.status != 404 {
		t.Errorf("deleted context: %d", x.status)
	}
}

func TestTimeoutInterrupts(t *testing.T) {
	ts := newTestServer(t, nil)
	for _, c := range []struct{ lang, loop, after, want string }{
		{"python", "n = 1\nwhile True: pass", "print(n)", "1\n"},
		{"javascript", "var n = 1; while (true) {}", "console.log(n)", "1\n"},
		{"bash", "n=1\nwhile true; do :; done\necho not-reached", "echo $n", "1\n"},
		{"bash", "n=1\nsleep 60\necho not-reached", "echo $n", "1\n"},
	} {
		t.Run(c.lang, func(t *testing.T) {
			x := ts.exec(t, ExecuteRequest{Language: c.lang, Code: c.loop, TimeoutMS: 300})
			if !x.end.TimedOut || len(x.errs) != 1 || strings.Contains(x.stdout, "not-reached") {
				t.Fatalf("interrupted execution: %+v", x)
			}
			if x := ts.exec(t, ExecuteRequest{Language: c.lang, Code: c.after}); x.stdout != c.want || len(x.errs) != 0 {
				t.Errorf("after the interrupt: %+v", x)
			}
		})
	}
}

// An execution that fails leaves the next one of its context alone, as
// well as the environment it set. The kernel waits a second after a
// failed execution before it stops aborting the requests that arrived in
// the meantime: without that wait the next request would have to come
// within one turn of its event loop to be aborted.
func TestErrorKeepsNextExecution(t *testing.T) {
	ts := newTestServer(t, nil)
	if x := ts.exec(t, ExecuteRequest{Code: "get_ipython().kernel.stop_on_error_timeout = 1.0"}); len(x.errs) != 0 {
		t.Fatalf("widening the abort window: %+v", x)
	}
	for _, c := range []struct {
		name string
		req  ExecuteRequest
	}{
		{"error", ExecuteRequest{Code: "1/0"}},
		{"interrupt", ExecuteRequest{Code: "while True: pass", TimeoutMS: 300}},
		{"error with env_vars", ExecuteRequest{Code: "1/0", Env: map[string]string{"CORRAL_T": "set"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if x := ts.exec(t, c.req); len(x.errs) != 1 {
				t.Fatalf("failing execution: %+v", x)
			}
			x := ts.exec(t, ExecuteRequest{Code: "import os; os.environ.get('CORRAL_T', 'unset')"})
			if x.main()["text"] != "unset" || len(x.errs) != 0 || x.count == 0 {
				t.Errorf("next execution: %+v", x)
			}
		})
	}
}

// A client that goes away interrupts its execution, as E2B's does.
func TestDisconnectInterrupts(t *testing.T) {
	ts := newTestServer(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts.execCtx(ctx, t, ExecuteRequest{Code: "import time\nwhile True: time.sleep(0.01)"})
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-done
	if x := ts.exec(t, ExecuteRequest{Code: "2 + 2"}); x.main()["text"] != "4" {
		t.Errorf("after a disconnect: %+v", x)
	}
}

func TestDeadKernel(t *testing.T) {
	ts := newTestServer(t, nil)
	ts.exec(t, ExecuteRequest{Code: "kept = 1"})
	x := ts.exec(t, ExecuteRequest{Code: "import os; os._exit(1)"})
	if len(x.errs) != 1 || x.errs[0].Name != "DeadKernelError" {
		t.Fatalf("os._exit: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{Code: "1"}); len(x.errs) != 1 || x.errs[0].Name != "DeadKernelError" {
		t.Fatalf("a dead context answers an error until restarted: %+v", x)
	}
	var list []ContextInfo
	ts.call(t, "GET", "/contexts", nil, &list)
	if st := ts.call(t, "POST", "/contexts/"+list[0].ID+"/restart", nil, nil); st != 200 {
		t.Fatalf("restart: %d", st)
	}
	if x := ts.exec(t, ExecuteRequest{Code: "'kept' in globals(), 1 + 1"}); x.main()["text"] != "(False, 2)" {
		t.Errorf("after restart: %+v", x)
	}
}

func TestOutputLimit(t *testing.T) {
	ts := newTestServer(t, func(o *Options) { o.MaxOutput = 1 << 20 })
	// 100 MB printed; the stream carries the limit and a marker.
	x := ts.exec(t, ExecuteRequest{Code: "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\nprint('done')\n'finished'"})
	if len(x.stdout) > 1<<20+200 || !strings.Contains(x.stdout, "[output truncated") {
		t.Fatalf("stdout %d bytes, tail %q", len(x.stdout), x.stdout[max(0, len(x.stdout)-100):])
	}
	if x.end.Truncated < 99<<20 || x.main()["text"] != "finished" {
		t.Errorf("end %+v, result %+v", x.end, x.main())
	}
	// A request may ask for less.
	x = ts.exec(t, ExecuteRequest{Language: "bash", Code: "head -c 5000 /dev/zero | tr '\\0' y", MaxOutputBytes: 1000})
	if !strings.HasPrefix(x.stdout, strings.Repeat("y", 1000)+"\n[output truncated") || x.end.Truncated != 4000 {
		t.Errorf("bash: %d bytes, end %+v", len(x.stdout), x.end)
	}
}

func TestHealth(t *testing.T) {
	ts := newTestServer(t, nil)
	if st := ts.call(t, "GET", "/health", nil, nil); st != 200 {
		t.Errorf("health: %d", st)
	}
}

// Output larger than a pipe's buffer, characters split between reads, and
// a cell that redirects its own shell all end where they should.
func TestStreamKernelEdges(t *testing.T) {
	ts := newTestServer(t, nil)
	big := 300_000
	if x := ts.exec(t, ExecuteRequest{Language: "javascript", Code: "console.log('x'.repeat(" + strconv.Itoa(big) + "))"}); len(x.stdout) != big+1 {
		t.Errorf("javascript: %d bytes of stdout, want %d", len(x.stdout), big+1)
	}
	if x := ts.exec(t, ExecuteRequest{Language: "javascript", Code: "1"}); x.main()["text"] != "1" || x.stdout != "" {
		t.Errorf("after a large output: %+v", x)
	}
	x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "for i in $(seq 50000); do printf 'é'; done"})
	if !utf8.ValidString(x.stdout) || x.stdout != strings.Repeat("é", 50000) {
		t.Errorf("bash multi-byte output: %d bytes, valid %v", len(x.stdout), utf8.ValidString(x.stdout))
	}
	if x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "exec >/dev/null 2>&1\necho gone", TimeoutMS: 10_000}); x.end.TimedOut {
		t.Errorf("a cell that redirects its shell did not end: %+v", x)
	}
	if x := ts.exec(t, ExecuteRequest{Language: "bash", Code: "echo still", TimeoutMS: 10_000}); x.end.TimedOut || len(x.errs) != 0 {
		t.Errorf("after the redirect: %+v", x)
	}
}

func TestPartialRune(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"abc", 0}, {"ab\xc3", 1}, {"ab\xc3\xa9", 0}, {"\xe2\x82", 2}, {"\xe2\x82\xac", 0}, {"\xf0\x9f\x98", 3}, {"", 0},
	} {
		if got := partialRune([]byte(c.in)); got != c.want {
			t.Errorf("partialRune(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
