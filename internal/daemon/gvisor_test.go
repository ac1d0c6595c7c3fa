package daemon

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRuntimesFlag(t *testing.T) {
	var v []string
	if err := (runtimesFlag{&v}).Set(" runc, gvisor ,"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"runc", "gvisor"}, v); diff != "" {
		t.Errorf("Set (-want +got):\n%s", diff)
	}
	if got := (runtimesFlag{&v}).String(); got != "runc,gvisor" {
		t.Errorf("String() = %q", got)
	}
}

func TestCheckRuntimes(t *testing.T) {
	tests := []struct {
		name     string
		runtime  string
		runtimes []string
		wantErr  string
	}{
		{name: "auto", runtime: "runc"},
		{name: "auto with gvisor default", runtime: "gvisor"},
		{name: "both", runtime: "gvisor", runtimes: []string{"runc", "gvisor"}},
		{name: "vm", runtime: "vm", runtimes: []string{"vm"}},
		{name: "unknown", runtime: "runc", runtimes: []string{"qemu"}, wantErr: `unknown runtime "qemu"`},
		{name: "default not offered", runtime: "gvisor", runtimes: []string{"runc"}, wantErr: "not in --runtimes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Runtime: tt.runtime, Runtimes: tt.runtimes}
			err := c.checkRuntimes()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("checkRuntimes() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
