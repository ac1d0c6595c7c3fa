package cli

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// secretDaemon answers the secret routes and records each request as
// "METHOD PATH BODY".
func secretDaemon(t *testing.T) (env func(stdin string) Env, out, errOut *bytes.Buffer, requests *[]string) {
	t.Helper()
	requests = new([]string)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		*requests = append(*requests, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "GET":
			_, _ = io.WriteString(w, `[{"name":"github","created_at":"2026-01-02T15:04:05Z","updated_at":"2026-01-03T15:04:05Z"}]`)
		case r.Method == "DELETE" && strings.HasSuffix(r.URL.Path, "/missing"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"not_found","message":"secret missing not found"}}`)
		case r.Method == "DELETE":
			w.WriteHeader(http.StatusNoContent)
		default:
			_, _ = io.WriteString(w, `{"name":"x","created_at":"2026-01-02T15:04:05Z","updated_at":"2026-01-02T15:04:05Z"}`)
		}
	}))
	t.Cleanup(ts.Close)
	out, errOut = new(bytes.Buffer), new(bytes.Buffer)
	env = func(stdin string) Env {
		return Env{Stdin: strings.NewReader(stdin), Stdout: out, Stderr: errOut, Getenv: func(k string) string {
			if k == "CORRAL_HOST" {
				return ts.URL
			}
			return ""
		}}
	}
	return env, out, errOut, requests
}

func TestSecretCommands(t *testing.T) {
	env, out, errOut, requests := secretDaemon(t)
	tests := []struct {
		name    string
		args    []string
		stdin   string
		code    int
		request string // "" when none is made
		stdout  string
	}{
		{"create trims one newline", []string{"secret", "create", "openai"}, "sk-1\n\n", 0,
			`POST /v1/secrets {"name":"openai","value":"sk-1\n"}`, "openai\n"},
		{"create trims CRLF", []string{"secret", "create", "openai"}, "sk-2\r\n", 0, `POST /v1/secrets {"name":"openai","value":"sk-2"}`, "openai\n"},
		{"create without newline", []string{"secret", "create", "openai"}, "sk-3", 0, `POST /v1/secrets {"name":"openai","value":"sk-3"}`, "openai\n"},
		{"rotate", []string{"secret", "rotate", "openai"}, "sk-4\n", 0, `PUT /v1/secrets/openai {"value":"sk-4"}`, "openai\n"},
		{"empty value", []string{"secret", "create", "openai"}, "\n", exitCLI, "", ""},
		{"too long", []string{"secret", "create", "big"}, strings.Repeat("v", 64<<10+1), exitCLI, "", ""},
		{"longest", []string{"secret", "create", "big"}, strings.Repeat("v", 64<<10) + "\n", 0, "POST /v1/secrets", "big\n"},
		{"value as an argument", []string{"secret", "create", "openai", "sk-5"}, "", exitUsage, "", ""},
		{"value as a flag", []string{"secret", "create", "--value", "sk-6"}, "", exitUsage, "", ""},
		{"no name", []string{"secret", "rotate"}, "sk-7", exitUsage, "", ""},
		{"ls", []string{"secret", "ls"}, "", 0, "GET /v1/secrets", "NAME    CREATED"},
		{"rm", []string{"secret", "rm", "openai", "missing"}, "", exitCLI, "DELETE /v1/secrets/openai,DELETE /v1/secrets/missing", "openai\n"},
		{"unknown", []string{"secret", "show", "openai"}, "", exitUsage, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out.Reset()
			errOut.Reset()
			*requests = nil
			if code := Main(tt.args, env(tt.stdin), nil, nil); code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errOut)
			}
			got := strings.Join(*requests, ",")
			if tt.request == "" && got != "" || !strings.HasPrefix(got, tt.request) {
				t.Errorf("requests %.200q, want %q", got, tt.request)
			}
			if !strings.HasPrefix(out.String(), tt.stdout) {
				t.Errorf("stdout %q, want %q", out, tt.stdout)
			}
			for _, v := range []string{"sk-1", "sk-2", "sk-3", "sk-4"} {
				if strings.Contains(out.String()+errOut.String(), v) {
					t.Errorf("the output shows the value %s", v)
				}
			}
		})
	}
}
