package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// codeDaemon is a daemon with gVisor and the code-interpreter template
// (daemontest.CodeInterpreterTemplate: built once per test run).
func codeDaemon(t testing.TB) *daemon {
	t.Helper()
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, e2eStorage, "--runtimes", "gvisor")
	d.CodeInterpreterTemplate("code-interpreter")
	return d
}

// TestCodeInterpreter runs code in sandboxes of the real code-interpreter
// template, on runc and gVisor, through the Go SDK and the CLI: state
// between executions, rich results and charts, the three languages, the
// sandbox's and the execution's environment, errors, interrupts, a dying
// kernel and bad input.
func TestCodeInterpreter(t *testing.T) {
	d := codeDaemon(t)
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			ctx := t.Context()
			sb := d.create(t, corral.CreateOptions{Template: "code-interpreter", Runtime: rt, MemoryMB: 1024,
				Env: map[string]string{"SB_VAR": "from-sandbox"}})
			run := func(code string, opts corral.CodeOptions) *corral.Execution {
				t.Helper()
				x, err := d.Client.RunCode(ctx, sb.ID, code, opts)
				if err != nil {
					t.Fatalf("RunCode(%q): %v", code, err)
				}
				return x
			}
			if x := run("x = 41\nprint('hi')\nx + 1", corral.CodeOptions{}); x.Text() != "42" || strings.Join(x.Stdout, "") != "hi\n" || x.ExecutionCount != 1 {
				t.Fatalf("first run: %+v", x)
			}
			if x := run("x * 2", corral.CodeOptions{}); x.Text() != "82" {
				t.Errorf("state between runs: %+v", x)
			}
			// The kernels run as "user" in its home, with the sandbox's env
			// and the execution's.
			x := run("import os\nos.getuid(), os.getcwd(), os.environ['SB_VAR'], os.environ.get('RUN_VAR')", corral.CodeOptions{Env: map[string]string{"RUN_VAR": "r"}})
			if x.Text() != "(1000, '/home/user', 'from-sandbox', 'r')" {
				t.Errorf("identity and env: %+v", x.Results)
			}
			x = run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 8])\nplt.title('growth')\nplt.show()", corral.CodeOptions{})
			if len(x.Results) != 1 || x.Results[0].PNG == "" || x.Results[0].Chart["type"] != "line" || x.Results[0].Chart["title"] != "growth" {
				t.Errorf("chart: %d results, error %v", len(x.Results), x.Error)
			}
			x = run("import pandas as pd\npd.DataFrame({'n': [1, 2]})", corral.CodeOptions{})
			if len(x.Results) != 1 || x.Results[0].Data["n"] == nil || !strings.Contains(x.Results[0].HTML, "<table") {
				t.Errorf("data frame: %+v", x.Results)
			}
			if x := run("const a = [1, 2, 3]; a.map(v => v * 2)", corral.CodeOptions{Language: "javascript"}); !strings.Contains(x.Text(), "2, 4, 6") {
				t.Errorf("javascript: %+v", x)
			}
			if x := run("echo $SB_VAR from $(whoami)", corral.CodeOptions{Language: "bash"}); strings.Join(x.Stdout, "") != "from-sandbox from user\n" {
				t.Errorf("bash: %+v", x)
			}
			if x := run("1/0", corral.CodeOptions{}); x.Error == nil || x.Error.Name != "ZeroDivisionError" {
				t.Errorf("exception: %+v", x)
			}
			x = run("while True: pass", corral.CodeOptions{Timeout: 500 * time.Millisecond})
			if !x.TimedOut || x.Error == nil {
				t.Errorf("timeout: %+v", x)
			}
			if x := run("x", corral.CodeOptions{}); x.Text() != "41" {
				t.Errorf("after an interrupt: %+v", x)
			}

			// Contexts: separate variables; bad input is refused.
			cc, err := d.Client.CreateCodeContext(ctx, sb.ID, "python", "/tmp")
			if err != nil {
				t.Fatal(err)
			}
			if x := run("'x' in globals(), __import__('os').getcwd()", corral.CodeOptions{Context: cc.ID}); x.Text() != "(False, '/tmp')" {
				t.Errorf("new context: %+v", x)
			}
			if _, err := d.Client.RunCode(ctx, sb.ID, "1", corral.CodeOptions{Context: cc.ID, Language: "python"}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
				t.Errorf("context and language: %v", err)
			}
			if _, err := d.Client.RunCode(ctx, sb.ID, "1", corral.CodeOptions{Context: "nope"}); corral.ErrorCode(err) != corral.CodeNotFound {
				t.Errorf("unknown context: %v", err)
			}
			// A kernel that exits is an error until its context restarts.
			if x := run("import os; os._exit(1)", corral.CodeOptions{Context: cc.ID}); x.Error == nil || x.Error.Name != "DeadKernelError" {
				t.Errorf("os._exit: %+v", x)
			}
			if err := d.Client.RestartCodeContext(ctx, sb.ID, cc.ID); err != nil {
				t.Fatal(err)
			}
			if x := run("1 + 1", corral.CodeOptions{Context: cc.ID}); x.Text() != "2" {
				t.Errorf("after restart: %+v", x)
			}
			if err := d.Client.DeleteCodeContext(ctx, sb.ID, cc.ID); err != nil {
				t.Fatal(err)
			}
			list, err := d.Client.CodeContexts(ctx, sb.ID)
			if err != nil || len(list) != 3 {
				t.Errorf("contexts after delete (python, javascript, bash defaults): %v %+v", err, list)
			}

			// The CLI: code as arguments, from stdin, and an image saved.
			if out, errOut, code := d.corral("code", sb.ID, "--", "print(6*7)"); code != 0 || out != "42\n" {
				t.Errorf("corral code: %d %q %q", code, out, errOut)
			}
			dir := t.TempDir()
			cmd := d.corralCmd("code", "--save", dir, sb.ID)
			cmd.Stdin = strings.NewReader("import matplotlib.pyplot as plt\nplt.bar(['a'], [1])\nplt.show()\n")
			out, err := cmd.Output()
			saved, _ := filepath.Glob(filepath.Join(dir, "*.png"))
			if err != nil || len(saved) != 1 || !strings.Contains(string(out), saved[0]) {
				t.Errorf("corral code with a chart from stdin: %v %q, files %v", err, out, saved)
			}
			if _, errOut, code := d.corral("code", sb.ID, "--", "1/0"); code != 1 || !strings.Contains(errOut, "ZeroDivisionError") {
				t.Errorf("corral code raising: %d %q", code, errOut)
			}
		})
	}
	// A sandbox without an interpreter says so.
	sb := d.create(t, corral.CreateOptions{Template: "bb"})
	if _, err := d.Client.RunCode(t.Context(), sb.ID, "1", corral.CodeOptions{}); corral.ErrorCode(err) != corral.CodeFailedPrecondition ||
		!strings.Contains(err.Error(), "code-interpreter") {
		t.Errorf("code in a busybox sandbox: %v", err)
	}
}
