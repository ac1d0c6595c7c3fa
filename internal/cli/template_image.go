package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/image"
	corral "github.com/corralrun/corral/sdk"
)

// streamTo returns stream options that print log lines and progress on
// the CLI's stderr (a progress bar on a terminal, plain lines otherwise),
// and the function that ends the progress output.
func (c *cli) streamTo() (corral.StreamOptions, func()) {
	pp := image.NewProgressPrinter(c.env.Stderr)
	return corral.StreamOptions{
		Log: &closingLog{w: c.env.Stderr, pp: pp},
		Progress: func(p corral.Progress) {
			pp.Update(image.Progress{Action: p.Action, ID: p.ID, Current: p.Current, Total: p.Total, Cached: p.Cached, Done: p.Done})
		},
	}, func() { _ = pp.Close() }
}

// closingLog ends the progress bar's line before a log line, so that the
// two do not share a line on a terminal.
type closingLog struct {
	w  io.Writer
	pp *image.ProgressPrinter
}

func (l *closingLog) Write(p []byte) (int, error) {
	_ = l.pp.Close()
	return l.w.Write(p)
}

// templatePull runs `corral template pull NAME REF [--platform P] [--insecure]`.
func (c *cli) templatePull(ctx context.Context, client *corral.Client, args []string) int {
	fs := c.flags("template pull")
	platform := fs.String("platform", "", "platform of a multi-platform image, e.g. linux/arm64 (default linux/amd64)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) != 2 {
		fmt.Fprintln(c.env.Stderr, "usage: corral template pull NAME REF [--platform P] [--insecure]")
		return exitUsage
	}
	stream, done := c.streamTo()
	t, err := client.PullTemplate(ctx, pos[0], corral.PullOptions{Ref: pos[1], Platform: *platform, Insecure: *insecure}, stream)
	done()
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// templateBuild runs `corral template build`: from a recipe
// (NAME [--recipe debian|busybox]) or from a Dockerfile
// (NAME -f FILE [CONTEXT], or NAME CONTEXT with CONTEXT/Dockerfile).
func (c *cli) templateBuild(ctx context.Context, client *corral.Client, args []string) int {
	const usage = "usage: corral template build NAME [--recipe debian|busybox]\n" +
		"       corral template build NAME [-f Dockerfile] [CONTEXT] [--build-arg K=V]... [--platform P] [--insecure]"
	fs := c.flags("template build")
	recipe := fs.String("recipe", "", "debian (default when no Dockerfile is given) or busybox")
	mirror := fs.String("mirror", "", "Debian mirror URL (debian recipe)")
	essential := fs.Bool("build-essential", false, "include compilers (debian recipe)")
	file := fs.String("f", "", "Dockerfile to build (- for stdin; default CONTEXT/Dockerfile)")
	var buildArgs multiFlag
	fs.Var(&buildArgs, "build-arg", "build argument K=V, or K to take its value from the environment (repeatable)")
	platform := fs.String("platform", "", "platform of the FROM image (default linux/amd64)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the FROM image's registry")
	network := fs.String("network", "", "network of RUN steps: none (default), allowlist or open")
	var domains multiFlag
	fs.Var(&domains, "allow-domain", "a domain RUN steps may reach (repeatable; implies --network allowlist)")
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(c.env.Stderr, usage)
		return exitUsage
	}
	name := pos[0]
	contextDir := ""
	if len(pos) == 2 {
		contextDir = pos[1]
	}
	if *file == "" && contextDir == "" {
		if *network != "" || len(domains) > 0 || len(buildArgs) > 0 || *platform != "" || *insecure {
			fmt.Fprintln(c.env.Stderr, "corral template build: --build-arg, --platform, --insecure, --network and --allow-domain need a Dockerfile (-f FILE or CONTEXT)")
			return exitUsage
		}
		if *recipe == "" {
			*recipe = "debian"
		}
		t, err := client.BuildTemplate(ctx, name, corral.BuildOptions{Recipe: *recipe, Mirror: *mirror, BuildEssential: *essential}, c.env.Stderr)
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.env.Stdout, t.Name)
		return 0
	}
	if *recipe != "" || *mirror != "" || *essential {
		fmt.Fprintln(c.env.Stderr, "corral template build: --recipe, --mirror and --build-essential do not apply to a Dockerfile build")
		return exitUsage
	}
	opts := corral.DockerfileOptions{ContextDir: contextDir, Platform: *platform, Insecure: *insecure, Args: map[string]string{},
		Network: *network, AllowDomains: domains}
	for _, kv := range buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			// As docker does: a bare name passes the variable's value
			// from this environment, and nothing when it is unset.
			if v, ok = lookupEnv(c.env.Getenv, k); !ok {
				continue
			}
		}
		if k == "" {
			fmt.Fprintf(c.env.Stderr, "corral template build: --build-arg %q has no name\n", kv)
			return exitUsage
		}
		opts.Args[k] = v
	}
	if *file == "" {
		*file = filepath.Join(contextDir, "Dockerfile")
	}
	if *file == "-" {
		opts.Dockerfile, err = io.ReadAll(c.env.Stdin)
	} else {
		opts.Dockerfile, err = os.ReadFile(*file)
	}
	if err != nil {
		return c.fail(fmt.Errorf("reading the Dockerfile: %w", err))
	}
	stream, done := c.streamTo()
	t, err := client.BuildTemplateFromDockerfile(ctx, name, opts, stream)
	done()
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// lookupEnv is os.LookupEnv through the CLI's environment; an empty value
// counts as unset.
func lookupEnv(getenv func(string) string, k string) (string, bool) {
	v := getenv(k)
	return v, v != ""
}

// parseInterspersed parses flags anywhere among the positional arguments
// ("NAME -f F DIR", "-f F NAME DIR", "NAME DIR -f F") and returns the
// positional ones. "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
