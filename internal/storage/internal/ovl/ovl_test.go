package ovl

import (
	"errors"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestCheckDir(t *testing.T) {
	tests := []struct {
		name string
		dir  string
		ok   bool
	}{
		{name: "plain", dir: "/var/lib/corral/storage", ok: true},
		{name: "dots and dashes", dir: "/tmp/a-b.c_d", ok: true},
		{name: "comma", dir: "/tmp/a,b"},
		{name: "colon", dir: "/tmp/a:b"},
		{name: "backslash", dir: `/tmp/a\b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckDir(tt.dir)
			if tt.ok != (err == nil) {
				t.Fatalf("CheckDir(%q) = %v, want ok %v", tt.dir, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("CheckDir(%q) = %v, want ErrInvalidArgument", tt.dir, err)
			}
		})
	}
}
