package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

func TestParseVolume(t *testing.T) {
	getwd := func() (string, error) { return "/home/u/proj", nil }
	tests := []struct {
		name, in string
		want     corral.Mount
		err      string // a part of the error; "" for none
	}{
		{name: "absolute, default mode", in: "/srv/data:/data", want: corral.Mount{Source: "/srv/data", Target: "/data", Mode: "rw"}},
		{name: "read-only", in: "/srv/data:/data:ro", want: corral.Mount{Source: "/srv/data", Target: "/data", Mode: "ro"}},
		{name: "copy-on-write", in: "/srv/data:/data:cow", want: corral.Mount{Source: "/srv/data", Target: "/data", Mode: "cow"}},
		{name: "explicit rw", in: "/srv:/srv:rw", want: corral.Mount{Source: "/srv", Target: "/srv", Mode: "rw"}},
		{name: "dot-slash", in: "./src:/work", want: corral.Mount{Source: "/home/u/proj/src", Target: "/work", Mode: "rw"}},
		{name: "dot-dot-slash", in: "../lib:/lib2:ro", want: corral.Mount{Source: "/home/u/lib", Target: "/lib2", Mode: "ro"}},
		{name: "dot", in: ".:/work", want: corral.Mount{Source: "/home/u/proj", Target: "/work", Mode: "rw"}},
		{name: "volume", in: "data:/data", want: corral.Mount{Volume: "data", Target: "/data", Mode: "rw"}},
		{name: "volume read-only", in: "cache.v1:/cache/:ro", want: corral.Mount{Volume: "cache.v1", Target: "/cache", Mode: "ro"}},
		{name: "volume relative target", in: "data:data", err: `target "data"`},
		{name: "empty source", in: ":/data", err: "source is empty"},
		{name: "relative target", in: "/srv:data", err: `target "data"`},
		{name: "empty target", in: "/srv:", err: `target ""`},
		{name: "bad mode", in: "/srv:/data:rwx", err: `mode "rwx"`},
		{name: "empty mode", in: "/srv:/data:", err: `mode ""`},
		{name: "docker options", in: "/srv:/data:ro,z", err: `mode "ro,z"`},
		{name: "one part", in: "/srv", err: "want SRC:DST"},
		{name: "four parts", in: "/a:/b:ro:x", err: "want SRC:DST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVolume(tt.in, getwd)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parseVolume(%q) = %+v, %v; want an error naming %s", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseVolume(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("parseVolume(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
	broken := func() (string, error) { return "", errors.New("gone") }
	if _, err := parseVolume("./x:/x", broken); err == nil {
		t.Error("a relative source without a working directory was accepted")
	}
	if m, err := parseVolume("/x:/x", broken); err != nil || m.Source != "/x" {
		t.Errorf("an absolute source asked for the working directory: %+v, %v", m, err)
	}
}

func TestVolumeFlags(t *testing.T) {
	var cf createFlags
	fs := (&cli{env: Env{Stderr: &bytes.Buffer{}}}).flags("create")
	cf.register(fs)
	if err := fs.Parse([]string{"-v", "/a:/a:ro", "--volume", "/b:/b"}); err != nil {
		t.Fatal(err)
	}
	opts, err := cf.options()
	if err != nil {
		t.Fatal(err)
	}
	want := []corral.Mount{{Source: "/a", Target: "/a", Mode: "ro"}, {Source: "/b", Target: "/b", Mode: "rw"}}
	if diff := cmp.Diff(want, opts.Mounts); diff != "" {
		t.Fatalf("mounts (-want +got):\n%s", diff)
	}
}

// A malformed -v is a usage error that names the bad part, before any
// request.
func TestVolumeUsageError(t *testing.T) {
	for _, args := range [][]string{
		{"run", "-v", "/srv:/data:rwx", "--", "true"},
		{"create", "--volume", "/srv:/data:rwx"},
	} {
		var out, errOut bytes.Buffer
		env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "unix:///nonexistent.sock" }}
		if code := Main(args, env, nil, nil); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
		if !strings.Contains(errOut.String(), `mode "rwx"`) {
			t.Errorf("%v: stderr %q does not name the mode", args, errOut.String())
		}
	}
}
