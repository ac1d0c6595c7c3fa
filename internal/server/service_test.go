package server

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	corral "github.com/corralrun/corral/sdk"
)

// TestTemplateServiceAPI sets services through pulls, Dockerfile builds
// and PUT/DELETE /v1/templates/{name}/service, and checks that bad ones
// are invalid_argument naming the field before anything is made.
func TestTemplateServiceAPI(t *testing.T) {
	c := newImageServer(t)
	ctx := t.Context()
	ref, _ := pushImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, Cmd: []string{"python3"}}, map[string]string{"etc/base": "base"})

	sv := &corral.Service{Shell: "serve", Ready: &corral.ReadyCheck{Port: 8000}, ReadyTimeoutMS: 3000}
	tmpl, err := c.PullTemplate(ctx, "pulled", corral.PullOptions{Ref: ref, Service: sv}, corral.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sv, tmpl.Service); diff != "" {
		t.Errorf("pulled service (-want +got):\n%s", diff)
	}

	builds := []struct {
		name, file string
		svc        corral.DockerfileService
		want       *corral.Service
	}{
		{"inherited", "FROM " + ref + "\n", corral.DockerfileService{}, nil},
		{"own-cmd", "FROM " + ref + "\nCMD [\"python3\", \"-m\", \"http.server\"]\n", corral.DockerfileService{ReadyURL: "http://127.0.0.1:8000/", ReadyTimeout: 1500 * time.Millisecond},
			&corral.Service{Cmd: []string{"python3", "-m", "http.server"}, Ready: &corral.ReadyCheck{URL: "http://127.0.0.1:8000/"}, ReadyTimeoutMS: 1500}},
		{"start-flag", "FROM " + ref + "\nCMD x\n", corral.DockerfileService{Start: "y", Ready: "test -e /ok", Restart: corral.RestartOnFailure},
			&corral.Service{Shell: "y", Ready: &corral.ReadyCheck{Shell: "test -e /ok"}, Restart: corral.RestartOnFailure}},
		{"no-start", "FROM " + ref + "\nCMD x\n", corral.DockerfileService{NoStart: true}, nil},
	}
	for _, b := range builds {
		t.Run(b.name, func(t *testing.T) {
			tmpl, err := c.BuildTemplateFromDockerfile(ctx, b.name, corral.DockerfileOptions{Dockerfile: []byte(b.file), Service: b.svc}, corral.StreamOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b.want, tmpl.Service); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
		})
	}

	bad := []struct {
		name string
		do   func() error
		msg  string
	}{
		{"pull restart", func() error {
			_, err := c.PullTemplate(ctx, "x", corral.PullOptions{Ref: ref, Service: &corral.Service{Shell: "s", Restart: "sometimes"}}, corral.StreamOptions{})
			return err
		}, "restart"},
		{"build two ready checks", func() error {
			_, err := c.BuildTemplateFromDockerfile(ctx, "x", corral.DockerfileOptions{Dockerfile: []byte("FROM scratch\n"),
				Service: corral.DockerfileService{Start: "s", Ready: "true", ReadyPort: 80}}, corral.StreamOptions{})
			return err
		}, "ready_port"},
		{"build timeout", func() error {
			_, err := c.BuildTemplateFromDockerfile(ctx, "x", corral.DockerfileOptions{Dockerfile: []byte("FROM scratch\n"),
				Service: corral.DockerfileService{Start: "s", ReadyTimeout: time.Hour}}, corral.StreamOptions{})
			return err
		}, "ready_timeout"},
		{"build no_start with start", func() error {
			_, err := c.BuildTemplateFromDockerfile(ctx, "x", corral.DockerfileOptions{Dockerfile: []byte("FROM scratch\n"),
				Service: corral.DockerfileService{Start: "s", NoStart: true}}, corral.StreamOptions{})
			return err
		}, "no_start"},
		{"recipe without start", func() error {
			_, err := c.BuildTemplate(ctx, "x", corral.BuildOptions{Recipe: "busybox", Service: &corral.Service{Restart: "always"}}, nil)
			return err
		}, "start command"},
		{"set bad url", func() error {
			_, err := c.SetTemplateService(ctx, "pulled", &corral.Service{Shell: "s", Ready: &corral.ReadyCheck{URL: "ftp://x"}})
			return err
		}, "url"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			err := b.do()
			var e *corral.Error
			if !errors.As(err, &e) || e.Code != corral.CodeInvalidArgument || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, b.msg) {
				t.Errorf("error %v, want invalid_argument (400) naming %q", err, b.msg)
			}
		})
	}
	if _, err := c.Template(ctx, "x"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Errorf("a refused request left template x: %v", err)
	}

	tmpl, err = c.SetTemplateService(ctx, "inherited", &corral.Service{Cmd: []string{"/bin/server"}})
	if err != nil || tmpl.Service == nil || tmpl.Service.Cmd[0] != "/bin/server" {
		t.Fatalf("set service: %+v, %v", tmpl, err)
	}
	if got, _ := c.Template(ctx, "inherited"); got.Service == nil {
		t.Error("GET does not show the service that was set")
	}
	if tmpl, err = c.SetTemplateService(ctx, "inherited", nil); err != nil || tmpl.Service != nil {
		t.Errorf("clear service: %+v, %v", tmpl, err)
	}
	if _, err := c.SetTemplateService(ctx, "missing", nil); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Errorf("service of a missing template: %v", err)
	}
}
