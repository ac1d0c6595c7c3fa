package cli

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

func TestServiceFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    *corral.Service
		wantDF  corral.DockerfileService
		wantErr bool
	}{
		{"none", nil, nil, corral.DockerfileService{}, false},
		{"start and port", []string{"--start", "python3 -m http.server", "--ready-port", "8000", "--ready-timeout", "90s"},
			&corral.Service{Shell: "python3 -m http.server", Ready: &corral.ReadyCheck{Port: 8000}, ReadyTimeoutMS: 90000},
			corral.DockerfileService{Start: "python3 -m http.server", ReadyPort: 8000, ReadyTimeout: 90 * time.Second}, false},
		{"ready url and restart", []string{"--ready-url", "http://127.0.0.1/", "--restart", "always"},
			&corral.Service{Restart: "always", Ready: &corral.ReadyCheck{URL: "http://127.0.0.1/"}},
			corral.DockerfileService{ReadyURL: "http://127.0.0.1/", Restart: "always"}, false},
		{"no-start", []string{"--no-start"}, nil, corral.DockerfileService{NoStart: true}, false},
		{"no-start with start", []string{"--no-start", "--start", "x"}, nil, corral.DockerfileService{}, true},
		{"bad timeout", []string{"--start", "x", "--ready-timeout", "soon"}, nil, corral.DockerfileService{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var f serviceFlags
			f.register(fs, true)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.service()
			if tt.wantErr {
				if err == nil {
					t.Fatalf("service() = %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
			df, err := f.dockerfile()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantDF, df); diff != "" {
				t.Errorf("dockerfile service (-want +got):\n%s", diff)
			}
		})
	}
}
