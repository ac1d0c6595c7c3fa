package cli

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{"2026-01-02T14:04:05Z", time.Date(2026, 1, 2, 14, 4, 5, 0, time.UTC), false},
		{"2026-01-02T14:04:05.5+01:00", time.Date(2026, 1, 2, 13, 4, 5, 5e8, time.UTC), false},
		{"10m", now.Add(-10 * time.Minute), false},
		{"2h", now.Add(-2 * time.Hour), false},
		{"30", now.Add(-30 * time.Second), false},
		{"yesterday", time.Time{}, true},
		{"2026-01-02", time.Time{}, true},
		{"-5m", time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSince(tt.in, now)
			if (err != nil) != tt.wantErr || !got.Equal(tt.want) {
				t.Fatalf("parseSince(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestFormatAudit(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 4, 5, 123456789, time.UTC)
	zero, nine := 0, 137
	tests := []struct {
		name string
		r    corral.AuditRecord
		want string
	}{
		{"API call", corral.AuditRecord{Time: at, Key: "ci", Action: "POST /v1/sandboxes", SandboxID: "sb1", Status: 201, DurationMS: 340.4},
			"2026-01-02T15:04:05.123Z  ci  POST /v1/sandboxes  sb1  201  340ms"},
		{"failed call without key or sandbox", corral.AuditRecord{Time: at, Action: "POST /v1/sandboxes", Status: 429, DurationMS: 0.25, Error: "limit reached"},
			"2026-01-02T15:04:05.123Z  -  POST /v1/sandboxes  -  429  250µs  error: limit reached"},
		{"command", corral.AuditRecord{Time: at, Key: "ci", Action: "exec", SandboxID: "sb1", Argv: []string{"python3", "-c", "print('hi')", ""}, ExitCode: &zero, DurationMS: 1500},
			`2026-01-02T15:04:05.123Z  ci  exec  sb1  python3 -c 'print('\''hi'\'')' ''  exit 0  1.5s`},
		{"killed", corral.AuditRecord{Time: at, Key: "ci", Action: "process", SandboxID: "sb1", Argv: []string{"sleep", "1h"}, ExitCode: &nine, Signal: "SIGKILL"},
			"2026-01-02T15:04:05.123Z  ci  process  sb1  sleep 1h  exit 137  signal SIGKILL"},
		{"code", corral.AuditRecord{Time: at, Key: "ci", Action: "code", SandboxID: "sb1", CodeSHA256: strings.Repeat("0123456789abcdef", 4)},
			"2026-01-02T15:04:05.123Z  ci  code  sb1  code sha256:0123456789ab"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formatAudit(tt.r, time.UTC); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestAuditUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an argument", []string{"audit", "sb1"}, auditUsage},
		{"bad since", []string{"audit", "--since", "yesterday"}, `invalid --since "yesterday"`},
		{"unknown flag", []string{"audit", "--tenant", "x"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := runMain(t, tt.args...)
			if code != exitUsage || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut, exitUsage, tt.want)
			}
		})
	}
}

// auditDaemon answers GET /v1/audit with lines and GET /v1/sandboxes with
// two sandboxes, and records the audit query.
func auditDaemon(t *testing.T, lines ...string) (env Env, out, errOut *bytes.Buffer, query *string) {
	query = new(string)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/audit":
			*query = r.URL.RawQuery
			w.Header().Set("Content-Type", "application/x-ndjson")
			for _, l := range lines {
				fmt.Fprintln(w, l)
			}
		case "/v1/sandboxes":
			fmt.Fprintln(w, `[{"id":"sb1"},{"id":"sb2"}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	out, errOut = new(bytes.Buffer), new(bytes.Buffer)
	env = Env{Stdin: strings.NewReader(""), Stdout: out, Stderr: errOut, Getenv: func(k string) string {
		if k == "CORRAL_HOST" {
			return ts.URL
		}
		return ""
	}}
	return env, out, errOut, query
}

func TestAuditOutput(t *testing.T) {
	const line = `{"time":"2026-01-02T15:04:05.123Z","tenant":"acme","key":"ci","action":"exec","sandbox_id":"sb1","argv":["ls","/"],"exit_code":0,"duration_ms":3}`
	env, out, errOut, query := auditDaemon(t, line, line)

	if code := Main([]string{"audit", "--sandbox", "sb1", "--key", "ci", "--since", "2026-01-02T15:00:00Z", "--json"}, env, nil, nil); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "key=ci&sandbox=sb1&since=2026-01-02T15%3A00%3A00Z"; *query != want {
		t.Errorf("query %q, want %q", *query, want)
	}
	if diff := cmp.Diff(line+"\n"+line+"\n", out.String()); diff != "" {
		t.Errorf("--json output (-want +got):\n%s", diff)
	}

	out.Reset()
	if code := Main([]string{"audit"}, env, nil, nil); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], "  ci  exec  sb1  ls /  exit 0  3ms") {
		t.Errorf("output:\n%s", out)
	}
}

func TestAuditCompletesSandboxes(t *testing.T) {
	env, out, errOut, _ := auditDaemon(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "--sandbox", ""}, "sb1\nsb2\n:4\n"},
		{[]string{"audit", "--follow", ""}, ":4\n"},
	} {
		out.Reset()
		if code := Main(append([]string{"__completeNoDesc"}, tt.args...), env, nil, nil); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if got, _, _ := strings.Cut(out.String(), "Completion ended"); got != tt.want {
			t.Errorf("%v: completions %q, want %q", tt.args, got, tt.want)
		}
	}
}
