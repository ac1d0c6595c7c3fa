package templates

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

func TestBuildService(t *testing.T) {
	plan := func(own bool, entrypoint, cmd []string) *ociimage.BuildResult {
		return &ociimage.BuildResult{Plan: &ociimage.Plan{OwnCommand: own, Defaults: ociimage.Defaults{Entrypoint: entrypoint, Cmd: cmd}}}
	}
	ready := &wire.ReadyCheck{Port: 8000}
	tests := []struct {
		name    string
		res     *ociimage.BuildResult
		sv      *sandbox.Service
		noStart bool
		want    *sandbox.Service
		wantErr bool
	}{
		{"inherited command does not start", plan(false, nil, []string{"python3"}), nil, false, nil, false},
		{"own exec cmd", plan(true, nil, []string{"python3", "-m", "http.server"}), nil, false,
			&sandbox.Service{Cmd: []string{"python3", "-m", "http.server"}}, false},
		{"entrypoint and cmd combine", plan(true, []string{"/entry.sh"}, []string{"serve"}), nil, false,
			&sandbox.Service{Cmd: []string{"/entry.sh", "serve"}}, false},
		{"shell form is shell", plan(true, nil, []string{"/bin/sh", "-c", "serve --port 80"}), nil, false,
			&sandbox.Service{Shell: "serve --port 80"}, false},
		{"shell entrypoint with cmd stays argv", plan(true, []string{"/bin/sh", "-c", "x"}, []string{"y"}), nil, false,
			&sandbox.Service{Cmd: []string{"/bin/sh", "-c", "x", "y"}}, false},
		{"no_start", plan(true, nil, []string{"serve"}), nil, true, nil, false},
		{"explicit service wins", plan(true, nil, []string{"serve"}), &sandbox.Service{Shell: "other"}, false,
			&sandbox.Service{Shell: "other"}, false},
		{"ready check on the file's command", plan(true, nil, []string{"serve"}), &sandbox.Service{Ready: ready, Restart: wire.RestartAlways}, false,
			&sandbox.Service{Cmd: []string{"serve"}, Ready: ready, Restart: wire.RestartAlways}, false},
		{"ready check without any command", plan(false, nil, []string{"python3"}), &sandbox.Service{Ready: ready}, false, nil, true},
		{"no_start with a service", plan(true, nil, []string{"serve"}), &sandbox.Service{Shell: "x"}, true, nil, true},
		{"empty own cmd", plan(true, nil, []string{}), nil, false, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := buildService(tt.res, tt.sv, tt.noStart)
			if tt.wantErr {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want invalid argument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServiceRecorded makes templates by pull, import and build and
// checks the service each records, and that a bad service fails before
// anything is made.
func TestServiceRecorded(t *testing.T) {
	e := newEnv(t)
	// The base image says CMD python3, which a build must not inherit as
	// a start command.
	base := testImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, Cmd: []string{"python3"}}, layer(t, member{"etc/", "/"}))
	ref := push(t, startRegistry(t), "test/py:1", base)
	sv := &sandbox.Service{Shell: "serve", Ready: &wire.ReadyCheck{URL: "http://127.0.0.1:8000/"}, ReadyTimeoutMS: 5000}

	tmpl, err := e.svc.Pull(t.Context(), "pulled", PullOptions{Ref: ref, Service: sv})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sv, tmpl.Service); diff != "" {
		t.Errorf("pulled service (-want +got):\n%s", diff)
	}
	if got, _ := e.m.Template(t.Context(), "pulled"); got.Service == nil || got.Service.Shell != "serve" {
		t.Errorf("recorded service %+v", got.Service)
	}
	_, err = e.svc.Pull(t.Context(), "bad", PullOptions{Ref: ref, Service: &sandbox.Service{Shell: "x", Restart: "sometimes"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "restart") {
		t.Errorf("pull with a bad restart policy: %v", err)
	}
	if _, err := e.m.Template(t.Context(), "bad"); err == nil {
		t.Error("a refused pull left a template")
	}

	var rootfs bytes.Buffer
	tw := tar.NewWriter(&rootfs)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.Close()
	tmpl, err = e.svc.Import(t.Context(), "imported", &rootfs, ImportOptions{Service: &sandbox.Service{Cmd: []string{"/bin/server"}}})
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Service == nil || tmpl.Service.Cmd[0] != "/bin/server" {
		t.Errorf("imported service %+v", tmpl.Service)
	}

	builds := []struct {
		name, file string
		opts       BuildOptions
		want       *sandbox.Service
	}{
		{"inherits-nothing", "FROM " + ref + "\nENV A=1\n", BuildOptions{}, nil},
		{"own-cmd", "FROM " + ref + "\nCMD [\"python3\", \"-m\", \"http.server\"]\n", BuildOptions{},
			&sandbox.Service{Cmd: []string{"python3", "-m", "http.server"}}},
		{"no-start", "FROM " + ref + "\nCMD python3 -m http.server\n", BuildOptions{NoStart: true}, nil},
		{"ready-port", "FROM " + ref + "\nCMD python3 -m http.server\n",
			BuildOptions{Service: &sandbox.Service{Ready: &wire.ReadyCheck{Port: 8000}}},
			&sandbox.Service{Shell: "python3 -m http.server", Ready: &wire.ReadyCheck{Port: 8000}}},
	}
	for _, b := range builds {
		t.Run(b.name, func(t *testing.T) {
			ins, err := ociimage.ParseBuildFile(strings.NewReader(b.file))
			if err != nil {
				t.Fatal(err)
			}
			b.opts.File = ins
			tmpl, err := e.svc.Build(t.Context(), b.name, b.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b.want, tmpl.Service); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
		})
	}
	ins, _ := ociimage.ParseBuildFile(strings.NewReader("FROM " + ref + "\n"))
	_, err = e.svc.Build(t.Context(), "port-without-command", BuildOptions{File: ins, Service: &sandbox.Service{Ready: &wire.ReadyCheck{Port: 8000}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "CMD") {
		t.Errorf("ready check without a command: %v", err)
	}
	_, err = e.svc.Build(t.Context(), "bad-port", BuildOptions{File: ins, Service: &sandbox.Service{Ready: &wire.ReadyCheck{Port: 70000}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "port") {
		t.Errorf("bad ready port: %v", err)
	}
	for _, n := range []string{"port-without-command", "bad-port"} {
		if _, err := e.m.Template(t.Context(), n); err == nil {
			t.Errorf("refused build %s left a template", n)
		}
	}
}
