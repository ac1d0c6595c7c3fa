package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseMB(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"", 0, false},
		{"512M", 512, false},
		{"512m", 512, false},
		{"512MiB", 512, false},
		{"2G", 2048, false},
		{"1.5g", 1536, false},
		{"64Mi", 64, false},
		{"1048576", 1, false},
		{"1", 1, false}, // one byte rounds up to a MiB
		{"100K", 1, false},
		{"1T", 1 << 20, false},
		{"lots", 0, true},
		{"-5M", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseMB("memory", tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseMB(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30", 30 * time.Second, false},
		{"0", 0, false},
		{"10m", 10 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{"-1m", 0, true},
		{"soon", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseDuration(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseDuration(%q) = %s, %v", tt.in, got, err)
			}
		})
	}
}

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		before, cmd []string
	}{
		{"with dashes", []string{"--memory", "1G", "--", "sh", "-c", "exit 7"}, []string{"--memory", "1G"}, []string{"sh", "-c", "exit 7"}},
		{"no dashes", []string{"id", "ls", "/"}, []string{"id", "ls", "/"}, nil},
		{"second dashes belong to the command", []string{"--", "sh", "--", "x"}, []string{}, []string{"sh", "--", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, cmd := splitCommand(tt.args)
			if diff := cmp.Diff(tt.before, before); diff != "" {
				t.Errorf("before (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.cmd, cmd); diff != "" {
				t.Errorf("cmd (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage: corral COMMAND"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"run without command", []string{"run", "--"}, "usage: corral run"},
		{"exec without id", []string{"exec"}, "usage: corral exec"},
		{"bad env", []string{"run", "-e", "NOEQUALS", "--", "true"}, "must be KEY=VALUE"},
		{"bad memory", []string{"create", "--memory", "lots"}, "invalid memory"},
		{"template without sub", []string{"template"}, "usage: corral template"},
		{"shell without id", []string{"shell"}, "usage: corral shell"},
		{"logs without pid", []string{"logs", "abc"}, "usage: corral logs"},
		{"logs with bad pid", []string{"logs", "abc", "x"}, "invalid process ID"},
		{"kill without pid", []string{"kill", "abc"}, "usage: corral kill"},
		{"attach without pid", []string{"attach", "abc"}, "usage: corral attach"},
		{"ps without id", []string{"ps"}, "usage: corral ps"},
		{"cp both local", []string{"cp", "a", "b"}, "exactly one of SRC and DST"},
		{"cp both remote", []string{"cp", "x:/a", "y:/b"}, "exactly one of SRC and DST"},
		{"cp one arg", []string{"cp", "x:/a"}, "usage: corral cp"},
		{"stop without id", []string{"stop"}, "usage: corral stop"},
		{"start without id", []string{"start"}, "usage: corral start"},
		{"start with a bad timeout", []string{"start", "--timeout", "soon", "abc"}, "soon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "unix:///nonexistent.sock" }}
			code := Main(tt.args, env, nil, nil)
			if code == 0 {
				t.Fatalf("exit 0 for %v", tt.args)
			}
			if !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("stderr %q does not contain %q", errOut.String(), tt.want)
			}
		})
	}
}

func TestUnreachableDaemonIsClear(t *testing.T) {
	var out, errOut bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		if k == "CORRAL_HOST" {
			return "unix:///nonexistent/corral.sock"
		}
		return ""
	}}
	if code := Main([]string{"ls"}, env, nil, nil); code != exitCLI {
		t.Fatalf("exit %d, want %d", code, exitCLI)
	}
	if !strings.Contains(errOut.String(), "daemon unreachable") {
		t.Fatalf("stderr %q", errOut.String())
	}
}
