package ocirt

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestMessage(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"logrus", `time="2026-01-01T00:00:00Z" level=error msg="container does not exist"`, "container does not exist"},
		{"escaped", `level=error msg="runc run failed: \"x\" missing"`, `runc run failed: "x" missing`},
		{"plain", "  something broke\n", "something broke"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Message(tt.in); got != tt.want {
				t.Errorf("Message(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name, msg string
		want      error
	}{
		{"runc unknown", "container does not exist", errdefs.ErrNotFound},
		{"runsc unknown", "FetchSpec failed: loading container: file does not exist", errdefs.ErrNotFound},
		{"not running", "container not running", errdefs.ErrFailedPrecondition},
		{"runsc state", `resume failed: cannot resume container "x" in state running`, errdefs.ErrFailedPrecondition},
		{"other", "something else", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Classify(&Error{Runtime: "runsc", Args: []string{"pause"}, Msg: tt.msg, Err: errors.New("exit status 1")})
			for _, kind := range []error{errdefs.ErrNotFound, errdefs.ErrFailedPrecondition} {
				if got := errors.Is(err, kind); got != (kind == tt.want) {
					t.Errorf("Classify(%q) is %v: %v, want %v", tt.msg, kind, got, kind == tt.want)
				}
			}
		})
	}
}

func TestMakeMountPoints(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := t.TempDir()
	// A tree whose owners were shifted before: new entries follow.
	if err := os.Chown(dir, 1000, 1001); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := MakeMountPoints(dir, []string{"/.corral/agent"}, []string{"/.corral/run"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name  string
		isDir bool
	}{{".corral", true}, {".corral/agent", false}, {".corral/run", true}} {
		fi, err := os.Lstat(filepath.Join(dir, tt.name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.IsDir() != tt.isDir || st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("%s: dir %v owner %d:%d; want dir %v owner 1000:1001", tt.name, fi.IsDir(), st.Uid, st.Gid, tt.isDir)
		}
	}
	// Symlinks out of the tree are not followed.
	evil := t.TempDir()
	if err := os.Symlink(evil, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := MakeMountPoints(dir, []string{"/out/x"}, nil); err == nil {
		t.Error("MakeMountPoints followed a symlink out of the tree")
	}
	if _, err := os.Lstat(filepath.Join(evil, "x")); err == nil {
		t.Error("a mount point was made outside the tree")
	}
}
