package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "plain", in: "default", ok: true},
		{name: "id", in: "sb-01HZ.x_y", ok: true},
		{name: "max length", in: strings.Repeat("a", 128), ok: true},
		{name: "empty", in: ""},
		{name: "too long", in: strings.Repeat("a", 129)},
		{name: "dot", in: "."},
		{name: "dotdot", in: ".."},
		{name: "hidden", in: ".tmp-x"},
		{name: "slash", in: "a/b"},
		{name: "comma", in: "a,b"},
		{name: "colon", in: "python:3"},
		{name: "leading dash", in: "-x"},
		{name: "space", in: "a b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckName("template name", tt.in)
			if tt.ok && err != nil {
				t.Fatalf("CheckName(%q) = %v, want nil", tt.in, err)
			}
			if !tt.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("CheckName(%q) = %v, want ErrInvalidArgument", tt.in, err)
			}
		})
	}
}

func TestTempName(t *testing.T) {
	a, b := TempName("x"), TempName("x")
	if a == b || !strings.HasPrefix(a, TempPrefix+"x-") {
		t.Fatalf("TempName gave %q and %q", a, b)
	}
	if len(TempName(strings.Repeat("a", maxNameLen))) > 255 {
		t.Fatal("TempName of the longest name exceeds 255 bytes")
	}
}

func TestListNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b", "a", ".tmp-c-1234", ".hidden"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ListNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" {
		t.Errorf("ListNames (-want +got):\n%s", diff)
	}
	got, err = ListNames(filepath.Join(dir, "missing"))
	if err != nil || len(got) != 0 {
		t.Errorf("ListNames(missing) = %v, %v; want empty, nil", got, err)
	}
}

func TestIsMountPoint(t *testing.T) {
	tests := []struct {
		name string
		path string
		want bool
	}{
		{name: "root", path: "/", want: true},
		{name: "proc", path: "/proc", want: true},
		{name: "plain dir", path: t.TempDir(), want: false},
		{name: "missing", path: "/nonexistent/x", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IsMountPoint(tt.path)
			if err != nil || got != tt.want {
				t.Fatalf("IsMountPoint(%s) = %v, %v; want %v", tt.path, got, err, tt.want)
			}
		})
	}
}

func TestUnmountNotMounted(t *testing.T) {
	testutil.RequiresRoot(t)
	if err := Unmount(t.Context(), t.TempDir()); err != nil {
		t.Fatalf("Unmount of a plain dir: %v", err)
	}
	if err := Unmount(t.Context(), "/nonexistent/x"); err != nil {
		t.Fatalf("Unmount of a missing path: %v", err)
	}
}
