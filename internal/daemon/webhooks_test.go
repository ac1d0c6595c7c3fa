package daemon

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWebhookFlags(t *testing.T) {
	t.Setenv("CORRAL_WEBHOOK_SECRET", "from-env")
	for _, tt := range []struct {
		name    string
		args    []string
		want    []string
		secret  string
		wantErr string
	}{
		{name: "none", args: nil, secret: "from-env"},
		{name: "two URLs, one secret", args: []string{"--webhook", "https://hooks.example.com/a?token=x", "--webhook", "http://127.0.0.1:9000/b", "--webhook-secret", "s"},
			want: []string{"https://hooks.example.com/a?token=x", "http://127.0.0.1:9000/b"}, secret: "s"},
		{name: "scheme", args: []string{"--webhook", "ftp://example.com/hook"}, wantErr: "want an http or https URL"},
		{name: "no host", args: []string{"--webhook", "http:///hook"}, wantErr: "no host"},
		{name: "relative", args: []string{"--webhook", "example.com/hook"}, wantErr: "want an http or https URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, ok := parseFlags(tt.args)
			if !ok {
				t.Fatalf("parseFlags(%q) refused", tt.args)
			}
			cfg.StateDir, cfg.AgentPath = t.TempDir(), "/bin/true"
			err := cfg.setDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), "--webhook") || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("setDefaults = %v, want an error about --webhook saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, cfg.Webhooks); diff != "" || cfg.WebhookSecret != tt.secret {
				t.Errorf("Webhooks (-want +got):\n%s\nsecret %q, want %q", diff, cfg.WebhookSecret, tt.secret)
			}
		})
	}
}
