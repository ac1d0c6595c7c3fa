package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// serviceFlags are the flags that give a template a service, shared by
// `template pull`, `template build` and `template service`.
type serviceFlags struct {
	start, ready, readyURL, readyTimeout, restart string
	readyPort                                     int
	noStart                                       bool
}

func (f *serviceFlags) register(fs *flag.FlagSet, noStart bool) {
	fs.StringVar(&f.start, "start", "", "start command (run with /bin/sh -c) of the template's service")
	fs.StringVar(&f.ready, "ready", "", "shell command that exits 0 once the service is ready")
	fs.IntVar(&f.readyPort, "ready-port", 0, "TCP port that accepts once the service is ready")
	fs.StringVar(&f.readyURL, "ready-url", "", "http:// URL (inside the sandbox) that answers once the service is ready")
	fs.StringVar(&f.readyTimeout, "ready-timeout", "", "how long a create waits for readiness, e.g. 30s (default 60s)")
	fs.StringVar(&f.restart, "restart", "", "restart policy: never (default), on-failure or always")
	if noStart {
		fs.BoolVar(&f.noStart, "no-start", false, "start no service (not even a Dockerfile's own CMD/ENTRYPOINT)")
	}
}

// any reports whether a service flag other than --no-start is set.
func (f *serviceFlags) any() bool {
	return f.start != "" || f.ready != "" || f.readyPort != 0 || f.readyURL != "" || f.readyTimeout != "" || f.restart != ""
}

// timeout parses --ready-timeout.
func (f *serviceFlags) timeout() (time.Duration, error) {
	if f.readyTimeout == "" {
		return 0, nil
	}
	d, err := parseDuration(f.readyTimeout)
	if err != nil {
		return 0, fmt.Errorf("--ready-timeout: %w", err)
	}
	return d, nil
}

// service returns the service the flags describe, nil when none is set.
func (f *serviceFlags) service() (*corral.Service, error) {
	if f.noStart && f.any() {
		return nil, errors.New("--no-start excludes the other service flags")
	}
	if !f.any() {
		return nil, nil
	}
	d, err := f.timeout()
	if err != nil {
		return nil, err
	}
	sv := &corral.Service{Shell: f.start, Restart: f.restart, ReadyTimeoutMS: d.Milliseconds()}
	if f.ready != "" || f.readyPort != 0 || f.readyURL != "" {
		sv.Ready = &corral.ReadyCheck{Shell: f.ready, Port: f.readyPort, URL: f.readyURL}
	}
	return sv, nil
}

// dockerfile returns the service of a Dockerfile build.
func (f *serviceFlags) dockerfile() (corral.DockerfileService, error) {
	d, err := f.timeout()
	if err != nil {
		return corral.DockerfileService{}, err
	}
	return corral.DockerfileService{Start: f.start, Ready: f.ready, ReadyPort: f.readyPort, ReadyURL: f.readyURL,
		ReadyTimeout: d, Restart: f.restart, NoStart: f.noStart}, nil
}

// templateService runs `corral template service NAME [--start CMD
// [--ready ...]] | --clear`; with neither it prints the service.
func (c *cli) templateService(ctx context.Context, client *corral.Client, args []string) int {
	const usage = "usage: corral template service NAME [--start CMD [--ready CMD | --ready-port N | --ready-url URL]\n" +
		"       [--ready-timeout DUR] [--restart POLICY] | --clear]"
	fs := c.flags("template service")
	var f serviceFlags
	f.register(fs, false)
	clear := fs.Bool("clear", false, "remove the template's service")
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) != 1 || (*clear && f.any()) {
		fmt.Fprintln(c.env.Stderr, usage)
		return exitUsage
	}
	if !*clear && !f.any() {
		t, err := client.Template(ctx, pos[0])
		if err != nil {
			return c.fail(err)
		}
		return c.printJSON(t.Service)
	}
	sv, err := f.service()
	if err != nil {
		fmt.Fprintf(c.env.Stderr, "corral template service: %v\n", err)
		return exitUsage
	}
	t, err := client.SetTemplateService(ctx, pos[0], sv)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// serviceSummary is a template's service in one short line for
// `template ls`: its start command, or "-".
func serviceSummary(sv *corral.Service) string {
	if sv == nil {
		return "-"
	}
	s := sv.Shell
	if s == "" {
		s = strings.Join(sv.Cmd, " ")
	}
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}
