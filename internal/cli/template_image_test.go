package cli

import (
	"flag"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseInterspersed(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantPos  []string
		wantFile string
	}{
		{"flags after name", []string{"NAME", "-f", "F", "DIR"}, []string{"NAME", "DIR"}, "F"},
		{"flags first", []string{"-f", "F", "NAME", "DIR"}, []string{"NAME", "DIR"}, "F"},
		{"flags last", []string{"NAME", "DIR", "-f", "F"}, []string{"NAME", "DIR"}, "F"},
		{"double dash", []string{"NAME", "--", "-f"}, []string{"NAME", "-f"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			file := fs.String("f", "", "")
			pos, err := parseInterspersed(fs, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantPos, pos); diff != "" || *file != tt.wantFile {
				t.Errorf("positional (-want +got):\n%s\n-f = %q, want %q", diff, *file, tt.wantFile)
			}
		})
	}
}
