package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// runMain runs the CLI against a daemon that is not there.
func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		if k == "CORRAL_HOST" {
			return "unix://" + filepath.Join(t.TempDir(), "none.sock")
		}
		return ""
	}}
	code = Main(args, env, nil, nil)
	return out.String(), errOut.String(), code
}

func TestCompletionScripts(t *testing.T) {
	tests := []struct {
		shell, want string
	}{
		{"bash", "__start_corral"},
		{"zsh", "#compdef corral"},
		{"fish", "complete -c corral"},
	}
	for _, tt := range tests {
		t.Run(tt.shell, func(t *testing.T) {
			out, errOut, code := runMain(t, "completion", tt.shell)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			if !strings.Contains(out, tt.want) {
				t.Fatalf("the %s script does not contain %q", tt.shell, tt.want)
			}
			if tt.shell != "bash" {
				return
			}
			bash, err := exec.LookPath("bash")
			if err != nil {
				t.Skip("no bash to parse the script")
			}
			script := filepath.Join(t.TempDir(), "corral.bash")
			if err := os.WriteFile(script, []byte(out), 0o600); err != nil {
				t.Fatal(err)
			}
			if msg, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
				t.Fatalf("bash -n: %v\n%s", err, msg)
			}
		})
	}
}

func TestCompletionUsage(t *testing.T) {
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}} {
		_, errOut, code := runMain(t, args...)
		if code != exitUsage || !strings.Contains(errOut, "usage: corral completion bash|zsh|fish") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

func TestCompleteArguments(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"template subcommands", []string{"template", ""}, []string{"ls", "inspect", "pull", "import", "build", "service", "capture", "rm"}},
		{"pool subcommands", []string{"pool", ""}, []string{"set", "ls", "rm"}},
		{"snapshot subcommands", []string{"snapshot", ""}, []string{"create", "ls", "rm", "template"}},
		{"shells", []string{"completion", ""}, []string{"bash", "zsh", "fish"}},
		{"commands by prefix", []string{"sn"}, []string{"snapshot"}},
		{"no daemon, no IDs", []string{"rm", ""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runMain(t, append([]string{"__completeNoDesc"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			got := lines[:len(lines)-1] // the last line is the directive
			if len(got) == 0 {
				got = nil
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("completions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help"} {
		out, _, code := runMain(t, arg)
		if code != 0 || !strings.HasPrefix(out, "usage: corral COMMAND [flags]") {
			t.Fatalf("%s: exit %d, stdout %q", arg, code, out)
		}
		for _, cmd := range commands() {
			if cmd.group != "" && !strings.Contains(out, "\n  "+cmd.name+" ") && !strings.Contains(out, "\n  "+cmd.name+"\n") {
				t.Errorf("%s: the help does not list %s", arg, cmd.name)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		out, _, code := runMain(t, arg)
		if code != 0 || out != "corral "+Version+"\n" {
			t.Errorf("%s: exit %d, stdout %q", arg, code, out)
		}
	}
}

func TestDispatchesServerAndAgent(t *testing.T) {
	var got []string
	entry := func(name string) func([]string) int {
		return func(args []string) int {
			got = append(got, name+" "+strings.Join(args, " "))
			return 3
		}
	}
	env := Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	for _, args := range [][]string{{"server", "--storage", "overlay"}, {"agent", "-h"}} {
		if code := Main(args, env, entry("server"), entry("agent")); code != 3 {
			t.Errorf("%v: exit %d, want the entry point's 3", args, code)
		}
	}
	if diff := cmp.Diff([]string{"server --storage overlay", "agent -h"}, got); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}
